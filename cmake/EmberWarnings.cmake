# Warning flags for Ember's own targets (LibTorch's headers are system
# headers and stay quiet). They sit on the interface target every Ember-built
# target links (ember_build_flags), because GCC rejects a precompiled header
# built with other flags: -Wpedantic, for one, changes predefined macros.
function(ember_warning_flags target)
  target_compile_options(${target} INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                              -Wno-unused-parameter -Winvalid-pch -Wundef>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${EMBER_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
endfunction()
