# Doxygen's input filter for Ember's headers (Doxyfile's INPUT_FILTER): the headers document
# themselves in plain // comments, which Doxygen reads only as ///. The file's opening comment
# becomes the file's description, a comment line above a declaration its documentation, and a
# trailing `// ...` after a member its ///< note; `<` in comments is escaped, so `<pad>` or
# `model.<name>` are text, not HTML. Code is passed through unchanged.
function text(s) { gsub(/</, "\\<", s); return s }
FNR == 1 { opening = 0 }
FNR == 1 && /^\/\// { opening = 1; sub(/^\/\/ ?/, ""); print "/** \\file"; print text($0); next }
opening && /^\/\// { sub(/^\/\/ ?/, ""); print text($0); next }
opening { print "*/"; opening = 0 }
# fmt's formatters for Ember's types are not Ember's API (and Doxygen finds no scope for them).
/^template <>$/ {
  if ((getline next_line) > 0) {
    if (next_line ~ /^struct fmt::formatter.*\{\};$/) {
      print "/// \\cond"; print; print next_line; print "/// \\endcond"; next
    }
    if (next_line ~ /^struct fmt::formatter/) { print "/// \\cond"; print; print next_line; hidden = 1; next }
    print; $0 = next_line
  }
}
hidden && /^};/ { print; print "/// \\endcond"; hidden = 0; next }
{
  line = $0
  if (line ~ /^[ \t]*\/\/ /) {
    i = index(line, "// ")
    line = substr(line, 1, i - 1) "/// " text(substr(line, i + 3))
  } else if (line ~ /[;,{][ \t]+\/\/ /) {
    match(line, /[ \t]+\/\/ /)
    line = substr(line, 1, RSTART - 1) "  ///< " text(substr(line, RSTART + RLENGTH))
  }
  print line
}
