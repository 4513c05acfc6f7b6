# Third-party dependencies besides LibTorch. All are Debian packages; all but
# zlib are header-only, so a source checkout can carry them to machines
# without apt (see tools/ember device-check).

# fmt, header-only. LibTorch's wheel ships its own fmt headers in its include
# directory, which comes before /usr/include on every target that links torch;
# linking Debian's compiled libfmt against those headers would mix versions.
# So Ember uses fmt header-only and takes LibTorch's copy when it has one.
set(_ember_torch_fmt OFF)
foreach(_dir IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_dir}/fmt/format.h")
    set(_ember_torch_fmt ON)
  endif()
endforeach()
add_library(ember_fmt INTERFACE)
target_compile_definitions(ember_fmt INTERFACE FMT_HEADER_ONLY=1)
if(NOT _ember_torch_fmt)
  find_package(fmt REQUIRED)
  target_link_libraries(ember_fmt INTERFACE fmt::fmt-header-only)
endif()

# toml++ (config files) and nlohmann_json (metrics, summaries): header-only,
# used only inside lib/src, never in public headers.
find_path(EMBER_TOMLPP_INCLUDE_DIR toml++/toml.h REQUIRED
          DOC "toml++ headers (Debian: libtomlplusplus-dev)")
find_path(EMBER_NLOHMANN_INCLUDE_DIR nlohmann/json.hpp REQUIRED
          DOC "nlohmann_json headers (Debian: nlohmann-json3-dev)")
add_library(ember_private_deps INTERFACE)
target_include_directories(ember_private_deps SYSTEM INTERFACE
  "${EMBER_TOMLPP_INCLUDE_DIR}" "${EMBER_NLOHMANN_INCLUDE_DIR}")

find_package(ZLIB REQUIRED)   # gzip-compressed IDX files
find_package(Threads REQUIRED)

if(EMBER_BUILD_TESTS)
  if(EMBER_GTEST_SOURCE_DIR)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory("${EMBER_GTEST_SOURCE_DIR}" "${CMAKE_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
    # googletest >= 1.11 defines these aliases itself.
    if(NOT TARGET GTest::gtest)
      add_library(GTest::gtest ALIAS gtest)
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
  else()
    find_package(GTest REQUIRED)
  endif()
  include(GoogleTest)
endif()
