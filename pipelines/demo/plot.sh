#!/bin/sh
# plot.sh METRICS OUTDIR - loss and learning rate per step from a bk-step metrics
# stream: OUTDIR/loss.png with gnuplot when installed, and OUTDIR/loss.txt as text.
set -eu
m=$1 out=$2
bk-dump "$m" | jq -r 'select(.step != null) | [.step, .loss, .lr] | @tsv' >"$out/loss.tsv"
if command -v gnuplot >/dev/null 2>&1; then
	gnuplot <<GP
set terminal pngcairo size 800,450 noenhanced
set output "$out/loss.png"
set title "bk-step: baking loss (KL teacher || student) and learning rate"
set xlabel "optimizer step"
set ylabel "loss"
set y2label "learning rate"
set y2tics
set ytics nomirror
plot "$out/loss.tsv" using 1:2 with lines lw 2 title "loss", \
     "$out/loss.tsv" using 1:3 axes x1y2 with lines dt 2 title "lr"
GP
fi
# text plot: 16 rows, one column per step (at most 60 columns)
awk -v rows=16 '
{ s[NR] = $1; l[NR] = $2; if ($2 > max) max = $2 }
END {
	n = NR; w = n < 60 ? n : 60
	for (c = 1; c <= w; c++) { i = int((c - 1) * n / w) + 1; v[c] = l[i] }
	printf "loss per step (max %.4f, %d steps)\n", max, n
	for (r = rows; r >= 1; r--) {
		line = sprintf("%8.4f |", max * r / rows)
		for (c = 1; c <= w; c++) line = line (v[c] >= max * (r - 0.5) / rows ? "*" : " ")
		print line
	}
	printf "         +"; for (c = 1; c <= w; c++) printf "-"; printf "\n"
	printf "          step 1%*s\n", w - 6, "step " n
}' "$out/loss.tsv" >"$out/loss.txt"
