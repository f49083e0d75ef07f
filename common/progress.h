/* progress.h - one progress line on stderr for long-running tools: records done,
 * tokens/s and an ETA when the total is known, redrawn with '\r' at most ~4 times a
 * second when stderr is a terminal; otherwise (a log file, nohup, a batch system)
 * printed as a plain line every BK_LOG_EVERY seconds (default 30; 0 = never).
 * Not a logger: final summaries are the tool's own fprintf/note. */
#ifndef BK_PROGRESS_H
#define BK_PROGRESS_H

#include <stdint.h>

typedef struct {
	int on;           /* drawing at all: stderr is a terminal and BK_PROGRESS != 0 */
	double every;     /* not a terminal: a plain line every this many seconds (0: none) */
	int drawn;        /* a line is on the screen (bk_progress_end ends it) */
	const char *what; /* unit of "done", e.g. "records" */
	uint64_t total;   /* expected "done" at the end; 0 = unknown (no ETA) */
	double t0, last;  /* monotonic seconds: start, last redraw */
} bk_progress;

/* Starts the clock.  BK_PROGRESS=0 in the environment turns drawing off, =1 forces it
 * on (tests); otherwise it is on iff isatty(2).  When it is off because stderr is not
 * a terminal, BK_LOG_EVERY (seconds, default 30) paces plain lines. */
void bk_progress_start(bk_progress *p, const char *what, uint64_t total);
/* The time since bk_progress_start, in seconds. */
double bk_progress_elapsed(const bk_progress *p);
/* Redraws "prog: DONE[/TOTAL] what, TOKENS tokens, R tokens/s, ETA h:mm:ss" when the
 * last redraw is over 0.25 s old; the token part only when tokens > 0. */
void bk_progress_update(bk_progress *p, uint64_t done, uint64_t tokens);
/* Draws the final state and ends the line (only if a line was drawn). */
void bk_progress_end(bk_progress *p, uint64_t done, uint64_t tokens);
/* "h:mm:ss" of a non-negative number of seconds into buf (at least 32 bytes). */
void bk_progress_hms(double s, char *buf, int n);

#endif
