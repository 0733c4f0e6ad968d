# cmake -DIN=page.html -DOUT=page_template.cpp -P embed.cmake
# Wraps the page template in a C++ raw string literal (qkv::inspect::kPageTemplate).
file(READ "${IN}" text)
set(delim "qkv_page")
string(FIND "${text}" ")${delim}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )${delim}\"")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} by embed.cmake; do not edit.\nnamespace qkv::inspect {\nextern const char* const kPageTemplate;\nconst char* const kPageTemplate = R\"${delim}(${text})${delim}\";\n}  // namespace qkv::inspect\n")
file(RENAME "${OUT}.tmp" "${OUT}")
