# Third-party dependencies besides LibTorch. All are Debian packages; all but
# zlib and the optional OpenCV are header-only, so a source checkout can carry
# them to machines without apt (see tools/ember device-pack).

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
# The image codecs of streamed datasets (augment/decode.cpp): libjpeg-turbo's
# libjpeg API (crop and DCT-scaled decoding) and libpng. Debian:
# libjpeg62-turbo-dev, libpng-dev (tools/ember setup installs them).
find_package(JPEG REQUIRED)
find_package(PNG REQUIRED)
find_package(Threads REQUIRED)

if(EMBER_BUILD_TESTS)
  if(EMBER_GTEST_SOURCE_DIR)
    set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
    set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
    add_subdirectory("${EMBER_GTEST_SOURCE_DIR}" "${PROJECT_BINARY_DIR}/_deps/googletest" EXCLUDE_FROM_ALL)
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

# OpenCV (optional; core, imgproc, imgcodecs): decodes and resizes images for
# ember::data::load_image_folder. Private to the shared library, so the
# installed package does not need it. EMBER_OPENCV: AUTO uses it when found,
# ON requires it, OFF never looks. Debian's small libopencv-{core,imgproc,
# imgcodecs}-dev packages ship no OpenCVConfig.cmake (only the full
# libopencv-dev does), so the headers and libraries are also looked up directly.
# Result: EMBER_WITH_OPENCV (ON/OFF), the target ember_opencv (the libraries to
# link) and EMBER_OPENCV_INCLUDE_DIRS, which only the files that use OpenCV get
# (ember_opencv_sources in lib/CMakeLists.txt): every other file compiles with
# the same flags with or without OpenCV.
set(EMBER_WITH_OPENCV OFF)
string(TOUPPER "${EMBER_OPENCV}" _ember_opencv_mode)
if(_ember_opencv_mode STREQUAL "AUTO")
  set(_ember_opencv_required OFF)
elseif(EMBER_OPENCV)
  set(_ember_opencv_required ON)
else()
  set(_ember_opencv_mode OFF)
endif()
if(NOT _ember_opencv_mode STREQUAL "OFF")
  add_library(ember_opencv INTERFACE)
  find_package(OpenCV QUIET COMPONENTS core imgproc imgcodecs)
  if(OpenCV_FOUND)
    # (OpenCV's imported targets bring their include directories along.)
    set(EMBER_OPENCV_INCLUDE_DIRS ${OpenCV_INCLUDE_DIRS})
    target_link_libraries(ember_opencv INTERFACE ${OpenCV_LIBS})
    set(EMBER_WITH_OPENCV ON)
    set(_ember_opencv_where "OpenCV ${OpenCV_VERSION} (${OpenCV_DIR})")
  else()
    find_path(EMBER_OPENCV_INCLUDE_DIR opencv2/imgcodecs.hpp PATH_SUFFIXES opencv4
              DOC "OpenCV 4 headers (Debian: libopencv-core-dev)")
    find_library(EMBER_OPENCV_CORE_LIBRARY opencv_core DOC "Debian: libopencv-core-dev")
    find_library(EMBER_OPENCV_IMGPROC_LIBRARY opencv_imgproc DOC "Debian: libopencv-imgproc-dev")
    find_library(EMBER_OPENCV_IMGCODECS_LIBRARY opencv_imgcodecs DOC "Debian: libopencv-imgcodecs-dev")
    if(EMBER_OPENCV_INCLUDE_DIR AND EMBER_OPENCV_CORE_LIBRARY AND EMBER_OPENCV_IMGPROC_LIBRARY
       AND EMBER_OPENCV_IMGCODECS_LIBRARY)
      set(EMBER_OPENCV_INCLUDE_DIRS "${EMBER_OPENCV_INCLUDE_DIR}")
      # imgcodecs needs imgproc needs core: link in that order.
      target_link_libraries(ember_opencv INTERFACE "${EMBER_OPENCV_IMGCODECS_LIBRARY}"
                            "${EMBER_OPENCV_IMGPROC_LIBRARY}" "${EMBER_OPENCV_CORE_LIBRARY}")
      set(EMBER_WITH_OPENCV ON)
      set(_ember_opencv_where "${EMBER_OPENCV_INCLUDE_DIR}, ${EMBER_OPENCV_IMGCODECS_LIBRARY}")
    endif()
  endif()
  if(EMBER_WITH_OPENCV)
    message(STATUS "[ember] OpenCV: ${_ember_opencv_where}")
  elseif(_ember_opencv_required)
    message(FATAL_ERROR "[ember] EMBER_OPENCV=ON but OpenCV (core, imgproc, imgcodecs) was not found: "
                        "install libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev "
                        "(Debian), set OpenCV_DIR, or configure with -DEMBER_OPENCV=AUTO or OFF")
  else()
    message(STATUS "[ember] OpenCV not found: ember::data::load_image_folder can only read its caches "
                   "(install libopencv-core-dev libopencv-imgproc-dev libopencv-imgcodecs-dev)")
  endif()
endif()
