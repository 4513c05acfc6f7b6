# Finds LibTorch and decides whether Ember's CUDA sources are compiled.
#
# Where LibTorch comes from, in order:
#   1. Torch_DIR or CMAKE_PREFIX_PATH given by the user (official zip, conda,
#      a source build, or the PyPI wheel's torch/share/cmake);
#   2. the python interpreter in EMBER_PYTHON (tools/ember passes the
#      project's virtual environment): torch.utils.cmake_prefix_path.
set(EMBER_PYTHON "" CACHE FILEPATH "Python whose torch package provides LibTorch")

if(NOT Torch_DIR AND EMBER_PYTHON)
  execute_process(
    COMMAND "${EMBER_PYTHON}" -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _ember_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    RESULT_VARIABLE _ember_rc)
  if(NOT _ember_rc EQUAL 0)
    message(FATAL_ERROR "[ember] ${EMBER_PYTHON} cannot import torch; run `tools/ember setup` "
                        "or point Torch_DIR at a LibTorch (see README).")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${_ember_torch_prefix}")
endif()

# LibTorch's own CUDA logic reads TORCH_CUDA_ARCH_LIST ("8.0;9.0") and
# ignores CMAKE_CUDA_ARCHITECTURES; give it ours so both agree.
set(_ember_arch_list "")
foreach(_a IN LISTS EMBER_CUDA_ARCHITECTURES)
  string(REGEX REPLACE "^([0-9]+)([0-9])([a-z]?)$" "\\1.\\2\\3" _dotted "${_a}")
  list(APPEND _ember_arch_list "${_dotted}")
endforeach()

# A CUDA LibTorch needs the CUDA toolkit at configure time (its config calls
# find_package(CUDAToolkit)); point it at nvcc when one is installed.
if(NOT CMAKE_CUDA_COMPILER)
  find_program(_ember_nvcc nvcc HINTS "$ENV{CUDA_HOME}/bin" /usr/local/cuda/bin)
  if(_ember_nvcc)
    set(CMAKE_CUDA_COMPILER "${_ember_nvcc}" CACHE FILEPATH "CUDA compiler")
  endif()
endif()
if(CMAKE_CUDA_COMPILER)
  set(TORCH_CUDA_ARCH_LIST "${_ember_arch_list}")
  get_filename_component(_ember_cuda_root "${CMAKE_CUDA_COMPILER}" DIRECTORY)
  get_filename_component(_ember_cuda_root "${_ember_cuda_root}" DIRECTORY)
  set(CUDAToolkit_ROOT "${_ember_cuda_root}" CACHE PATH "CUDA toolkit root")
endif()

get_directory_property(_ember_imported_before IMPORTED_TARGETS)
find_package(Torch REQUIRED)
# LibTorch's config sets CMAKE_CUDA_ARCHITECTURES to OFF; Ember's kernel
# targets set their own CUDA_ARCHITECTURES property instead.
if(NOT PROJECT_IS_TOP_LEVEL)
  # As a subproject (add_subdirectory, FetchContent): the imported targets
  # LibTorch's config just made (torch, torch_cuda, c10, CUDA::...) are local
  # to this directory, yet ember::ember's users link them through it. Make
  # them visible to the parent project, which then needs no find_package(Torch)
  # of its own (one made before is fine too: nothing new is imported then).
  get_directory_property(_ember_imported_after IMPORTED_TARGETS)
  foreach(_t IN LISTS _ember_imported_after)
    if(NOT _t IN_LIST _ember_imported_before)
      set_property(TARGET ${_t} PROPERTY IMPORTED_GLOBAL TRUE)
    endif()
  endforeach()
endif()

set(EMBER_WITH_CUDA OFF)
if(EMBER_CUDA AND CMAKE_CUDA_COMPILER AND TARGET torch_cuda)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(EMBER_WITH_CUDA ON)
elseif(EMBER_CUDA)
  message(STATUS "[ember] CUDA kernels disabled: "
                 "nvcc: '${CMAKE_CUDA_COMPILER}'; a CUDA LibTorch (torch_cuda target) is needed too")
endif()
