# ember_embed_text(<out_header> <input_file> <symbol>): makes a header defining
#   inline constexpr std::string_view <symbol> = "<file contents>";
# regenerated whenever the input changes (recipes embed their default config).
function(ember_embed_text out_header input symbol)
  add_custom_command(
    OUTPUT "${out_header}"
    COMMAND ${CMAKE_COMMAND} -DINPUT=${input} -DOUTPUT=${out_header} -DSYMBOL=${symbol}
            -P "${PROJECT_SOURCE_DIR}/cmake/EmberEmbedScript.cmake"
    DEPENDS "${input}" "${PROJECT_SOURCE_DIR}/cmake/EmberEmbedScript.cmake"
    COMMENT "Embedding ${input}")
endfunction()
