# Doxygen's input filter for graph/tensor_ops.def (Doxyfile's FILTER_PATTERNS): each row
# EMBER_OP(R, name, (call arguments), parameters…) becomes the free function it declares,
# `R name(const Tensor& self, parameters…);` in namespace ember, with EMBER_DEFAULT(v) as `= v`
# and the row's comments as its documentation (the method x.name(…) forwards to it).
function text(s) { gsub(/</, "\\<", s); return s }
# The position of the first comma at nesting depth 0 in s, or 0.
function top_comma(s,    i, c, depth) {
  depth = 0
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "(" || c == "{" || c == "<" || c == "[") depth++
    else if (c == ")" || c == "}" || c == ">" || c == "]") depth--
    else if (c == "," && depth == 0) return i
  }
  return 0
}
function balance(s,    t) { t = s; return gsub(/\(/, "", t) - gsub(/\)/, "", s) }
function defaults(s,    i, j, depth, c, out) {
  out = ""
  while ((i = index(s, "EMBER_DEFAULT(")) > 0) {
    out = out substr(s, 1, i - 1) "= "
    s = substr(s, i + 14)
    depth = 1
    for (j = 1; j <= length(s) && depth > 0; j++) {
      c = substr(s, j, 1)
      if (c == "(") depth++
      else if (c == ")") depth--
    }
    out = out substr(s, 1, j - 2)
    s = substr(s, j)
  }
  return out s
}
function declare(row,    body, c, r, name, params, note) {
  note = ""
  if (match(row, /\)[ \t]*\/\/ /)) { note = substr(row, RSTART + RLENGTH); row = substr(row, 1, RSTART) }
  body = substr(row, index(row, "EMBER_OP(") + 9)
  sub(/\)[ \t]*$/, "", body)
  c = top_comma(body); r = substr(body, 1, c - 1); body = substr(body, c + 1)
  c = top_comma(body); name = substr(body, 1, c - 1); body = substr(body, c + 1)
  c = top_comma(body); params = c ? substr(body, c + 1) : ""
  gsub(/^[ \t]+|[ \t]+$/, "", name); gsub(/^[ \t]+|[ \t]+$/, "", params); gsub(/[ \t]+/, " ", params)
  if (note != "") print "/// " text(note)
  print r " " name "(const Tensor& self" (params != "" ? ", " defaults(params) : "") ");"
}
FNR == 1 { opening = 0; row = "" }
FNR == 1 && /^\/\// { opening = 1; sub(/^\/\/ ?/, ""); print "/** \\file"; print text($0); next }
opening && /^\/\// { sub(/^\/\/ ?/, ""); print text($0); next }
opening { print "*/"; print "namespace ember {"; opening = 0 }
row != "" { row = row " " $0; if (balance(row) <= 0) { declare(row); row = "" }; next }
/^EMBER_OP\(/ { row = $0; if (balance(row) <= 0) { declare(row); row = "" }; next }
/^[ \t]*\/\/ ---/ { next }
/^[ \t]*\/\// { i = index($0, "// "); print "/// " text(substr($0, i + 3)); next }
{ print }
END { print "}  // namespace ember" }
