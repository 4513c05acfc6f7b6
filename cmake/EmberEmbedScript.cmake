file(READ "${INPUT}" _text)
file(WRITE "${OUTPUT}" "// Generated from ${INPUT}; do not edit.\n#pragma once\n#include <string_view>\n"
  "inline constexpr std::string_view ${SYMBOL} = R\"ember_embed(${_text})ember_embed\";\n")
