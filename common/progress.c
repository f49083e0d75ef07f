/* progress.c - the progress line of progress.h: '\r'-redrawn on a terminal, a plain
 * line every BK_LOG_EVERY seconds elsewhere.  Writes only to stderr; never changes
 * what a tool computes or outputs. */
#include "common/progress.h"
#include "common/diag.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double mono_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void bk_progress_start(bk_progress *p, const char *what, uint64_t total)
{
	const char *env = getenv("BK_PROGRESS");
	p->on = env && *env ? atoi(env) != 0 : isatty(2);
	const char *ev = getenv("BK_LOG_EVERY");
	p->every = 0;
	if (!p->on && !(env && *env)) {
		char *end = NULL;
		double e = ev && *ev ? strtod(ev, &end) : 30;
		p->every = (end && *end) || !(e >= 0) ? 30 : e;
	}
	p->drawn = 0;
	p->what = what;
	p->total = total;
	p->t0 = mono_s();
	p->last = 0;
}

double bk_progress_elapsed(const bk_progress *p)
{
	return mono_s() - p->t0;
}

void bk_progress_hms(double s, char *buf, int n)
{
	long t = s > 0 ? (long)(s + 0.5) : 0;
	snprintf(buf, (size_t)n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static void draw(bk_progress *p, uint64_t done, uint64_t tokens, double t)
{
	double dt = t - p->t0;
	char eta[48] = "", tot[32] = "";
	if (p->total) {
		snprintf(tot, sizeof tot, "/%llu", (unsigned long long)p->total);
		if (done > 0 && done <= p->total) {
			char hms[32];
			bk_progress_hms(dt / (double)done * (double)(p->total - done), hms, sizeof hms);
			snprintf(eta, sizeof eta, ", ETA %s", hms);
		}
	}
	char tok[64] = "";
	if (tokens)
		snprintf(tok, sizeof tok, ", %llu tokens, %.0f tokens/s", (unsigned long long)tokens,
			 dt > 0 ? (double)tokens / dt : 0.0);
	if (!p->on) { /* a plain line for a log */
		fprintf(stderr, "%s: %llu%s %s%s%s\n", bk_prog, (unsigned long long)done, tot,
			p->what, tok, eta);
		p->last = t;
		return;
	}
	fprintf(stderr, "\r%s: %llu%s %s%s%s   ", bk_prog, (unsigned long long)done, tot, p->what,
		tok, eta);
	fflush(stderr);
	p->drawn = 1;
	p->last = t;
}

void bk_progress_update(bk_progress *p, uint64_t done, uint64_t tokens)
{
	if (!p->on && !(p->every > 0))
		return;
	double t = mono_s();
	if (p->on ? t - p->last < 0.25 : t - (p->last ? p->last : p->t0) < p->every)
		return;
	draw(p, done, tokens, t);
}

void bk_progress_end(bk_progress *p, uint64_t done, uint64_t tokens)
{
	if (!p->on || !p->drawn)
		return;
	draw(p, done, tokens, mono_s());
	fputc('\n', stderr);
	p->drawn = 0;
}
