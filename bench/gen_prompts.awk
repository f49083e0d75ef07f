# gen_prompts.awk - a reproducible prompt file with a realistic length mix:
# 60% short questions (5-20 words), 30% paragraphs (30-120 words), 10% long (200-600).
# usage: awk -v n=20000 -v seed=1 -f bench/gen_prompts.awk
BEGIN {
	srand(seed)
	nw = split("the a dragon castle little girl boy park ball red big sun shining friend " \
		"happy sad played ran jumped over under tree house river story time once upon " \
		"what why how when where explain describe tell about please could you would me " \
		"garden flower bird sky blue green yellow mountain forest village king queen cat " \
		"dog mouse cheese bread water fire ice snow rain cloud wind star moon night day " \
		"école café naïve 日本語 Straße über", w, " ")
	for (i = 0; i < n; i++) {
		r = rand()
		if (r < 0.6) len = 5 + int(rand() * 16)
		else if (r < 0.9) len = 30 + int(rand() * 91)
		else len = 200 + int(rand() * 401)
		line = ""
		for (k = 0; k < len; k++) line = line (k ? " " : "") w[1 + int(rand() * nw)]
		print toupper(substr(line, 1, 1)) substr(line, 2) "?"
	}
}
