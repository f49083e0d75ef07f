# override_fields.awk - a YAML config with some top-level fields replaced:
#   awk -f bench/override_fields.awk FIELDS CONFIG >OUT
# FIELDS: "key: value" lines (blank lines skipped); each replaces CONFIG's line of the
# same key, or is appended when CONFIG has none.  -v model=DIR also replaces
# model_name_or_path.  Top-level scalar fields only (the bench configs' shape).
NR == FNR { if (!NF) next; k = $0; sub(/:.*/, "", k); over[k] = $0; next }
{ k = $0; sub(/:.*/, "", k) }
model != "" && k == "model_name_or_path" { print "model_name_or_path: \"" model "\""; next }
k in over { print over[k]; done[k] = 1; next }
{ print }
END { for (k in over) if (!(k in done)) print over[k] }
