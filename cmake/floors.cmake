# The floors of src/ (STYLE.md, "The house, floor by floor") as the build sees them: each floor is a
# static library qkv_FLOOR whose only include root is a folder holding the floors it may see — itself and
# the floors below it — so an #include that points up a floor does not compile.
#
#   core ← kernels ← attention ← blocks ← model ← train
#                                              ↖ inspect      cli sees every floor
#
# The include root of floor F is ${PROJECT_BINARY_DIR}/floors/F/: symbolic links to src/<floor>/ for each
# floor it sees and, in qkv/, to the public headers of those floors (QKV_PUBLIC_HEADERS below). So compiler
# messages about a header name it by that path (build/floors/F/core/parallel.hpp is src/core/parallel.hpp).
# The ctest architecture.floors (tools/check_floors.py) checks that an upward include fails to compile.

# include/qkv/NAME: the floor that implements it. A public header missing here is an error at configure
# time, so that a new one is placed on purpose.
set(QKV_PUBLIC_HEADERS
    core types.hpp runtime.hpp memory.hpp version.hpp  # core/types.cpp, runtime.cpp, memory.cpp; CMake writes version.hpp
    attention attention.hpp kv_cache.hpp              # attention/attention.cpp, kv_cache.cpp
    blocks mha.hpp                                    # blocks/mha.cpp
    model params.hpp model.hpp encoder.hpp)           # model/params.cpp, model/*.cpp
set(QKV_FLOORS core kernels attention blocks model train inspect cli)

# The public header NAME's floor, in OUT.
function(qkv_public_header_floor name out)
  set(floor "")
  foreach(word IN LISTS QKV_PUBLIC_HEADERS)
    if(word IN_LIST QKV_FLOORS)
      set(current ${word})
    elseif(word STREQUAL name)
      set(floor ${current})
    endif()
  endforeach()
  set(${out} ${floor} PARENT_SCOPE)
endfunction()

file(GLOB qkv_public_headers RELATIVE ${PROJECT_SOURCE_DIR}/include/qkv ${PROJECT_SOURCE_DIR}/include/qkv/*.hpp)
list(APPEND qkv_public_headers version.hpp)  # written by CMake into ${PROJECT_BINARY_DIR}/include/qkv
foreach(header IN LISTS qkv_public_headers)
  qkv_public_header_floor(${header} floor)
  if(NOT floor)
    message(FATAL_ERROR "include/qkv/${header} is on no floor: add it to QKV_PUBLIC_HEADERS in cmake/floors.cmake")
  endif()
endforeach()

# qkv_floor_includes(TARGET FLOOR [BELOW floor...]): TARGET (the floor FLOOR's library or program) gets the
# include root of FLOOR, which sees FLOOR and every floor BELOW names or those see in turn.
function(qkv_floor_includes target floor)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "BELOW")
  if(NOT floor IN_LIST QKV_FLOORS)
    message(FATAL_ERROR "qkv_floor_includes: '${floor}' is not a floor of QKV_FLOORS (cmake/floors.cmake)")
  endif()
  set(sees ${floor})
  foreach(below IN LISTS arg_BELOW)
    get_property(below_sees GLOBAL PROPERTY qkv_floor_sees_${below})
    if(NOT below_sees)
      message(FATAL_ERROR "qkv_floor_includes(${floor}): the floor '${below}' below it is not declared yet")
    endif()
    list(APPEND sees ${below_sees})
  endforeach()
  list(REMOVE_DUPLICATES sees)
  set_property(GLOBAL PROPERTY qkv_floor_sees_${floor} ${sees})

  set(root ${PROJECT_BINARY_DIR}/floors/${floor})
  file(REMOVE_RECURSE ${root})  # a floor that no longer sees a folder must lose its link
  file(MAKE_DIRECTORY ${root}/qkv)
  foreach(seen IN LISTS sees)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/src/${seen} ${root}/${seen} SYMBOLIC)
  endforeach()
  foreach(header IN LISTS qkv_public_headers)
    qkv_public_header_floor(${header} header_floor)
    if(header_floor IN_LIST sees)
      if(header STREQUAL "version.hpp")
        file(CREATE_LINK ${PROJECT_BINARY_DIR}/include/qkv/version.hpp ${root}/qkv/${header} SYMBOLIC)
      else()
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/qkv/${header} ${root}/qkv/${header} SYMBOLIC)
      endif()
    endif()
  endforeach()
  target_include_directories(${target} PRIVATE ${root})
  # The floors below are linked, but their usage requirements (the whole include/ they give users) are not taken.
  foreach(below IN LISTS arg_BELOW)
    target_link_libraries(${target} PRIVATE $<LINK_ONLY:qkv_${below}>)
  endforeach()
endfunction()

# qkv_floor(FLOOR [BELOW floor...]): the static library qkv_FLOOR (alias qkv::FLOOR) in the current folder.
# Users of it (tests, the aggregate qkv) get the public headers; the floors above it get only its link.
function(qkv_floor floor)
  add_library(qkv_${floor} STATIC)
  add_library(qkv::${floor} ALIAS qkv_${floor})
  qkv_floor_includes(qkv_${floor} ${floor} ${ARGN})
  target_include_directories(qkv_${floor} INTERFACE ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include)
  target_link_libraries(qkv_${floor} PRIVATE OpenMP::OpenMP_CXX)
endfunction()
