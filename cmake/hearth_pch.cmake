# Helpers for Hearth's two precompiled headers (included by CMakeLists.txt): which sources need
# ATen, and the checksum file that lets ccache share PCH-using objects between checkouts.
# Not a dependency scanner for the build: a wrong guess only costs compile time, never correctness.

# hearth_split_by_torch(<sources> <torch_out> <free_out>): splits <sources> (a list variable's
# name) into those whose quoted-include closure reaches <ATen/...>, <torch/...> or <c10/...>
# (<torch_out>) and the rest (<free_out>). Quoted includes resolve against the including file's
# folder, then src/ and tests/; angle includes of other libraries are not followed. A source that
# is misfiled still compiles (the PCH only saves parsing), so the scan is deliberately simple.
# Runs at configure time; cost: one file(STRINGS) per file in the closure, memoised.
function(hearth_split_by_torch sources torch_out free_out)
  set(torch "")
  set(free "")
  foreach(src IN LISTS ${sources})
    _hearth_needs_torch("${src}" needs)
    if(needs)
      list(APPEND torch "${src}")
    else()
      list(APPEND free "${src}")
    endif()
  endforeach()
  set(${torch_out} "${torch}" PARENT_SCOPE)
  set(${free_out} "${free}" PARENT_SCOPE)
endfunction()

# Sets <out> to TRUE when <file> reaches a Torch header. Memoised in global properties; an include
# cycle is cut by marking the file FALSE while it is being scanned (pragma once makes that safe).
function(_hearth_needs_torch file out)
  get_property(known GLOBAL PROPERTY "HEARTH_TORCH_${file}" SET)
  if(known)
    get_property(v GLOBAL PROPERTY "HEARTH_TORCH_${file}")
    set(${out} ${v} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "HEARTH_TORCH_${file}" FALSE)
  set(result FALSE)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  get_filename_component(dir "${file}" DIRECTORY)
  foreach(line IN LISTS lines)
    if(line MATCHES "#[ \t]*include[ \t]*<(ATen|torch|c10)/")
      set(result TRUE)
      break()
    elseif(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
      set(name "${CMAKE_MATCH_1}")
      foreach(base "${dir}" "${CMAKE_SOURCE_DIR}/src" "${CMAKE_SOURCE_DIR}/tests")
        if(EXISTS "${base}/${name}")
          get_filename_component(path "${base}/${name}" ABSOLUTE)
          _hearth_needs_torch("${path}" sub)
          if(sub)
            set(result TRUE)
          endif()
          break()
        endif()
      endforeach()
      if(result)
        break()
      endif()
    endif()
  endforeach()
  set_property(GLOBAL PROPERTY "HEARTH_TORCH_${file}" ${result})
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# hearth_pch_checksum(<target> <inputs...>): writes the file ccache's pch_external_checksum hashes
# instead of <target>'s .gch (whose bytes differ per build folder), so checkouts of one machine
# share compiled objects (scripts/build, HEARTH_CCACHE=1). <inputs> are the PCH's header files
# (hashed by content) and any other strings the PCH depends on (library versions); the compiler,
# build type, Torch version and include folders are added here. Reconfigures when a header changes.
function(hearth_pch_checksum target)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" type)
  set(sum "${CMAKE_CXX_COMPILER_ID};${CMAKE_CXX_COMPILER_VERSION};${CMAKE_BUILD_TYPE};${CMAKE_CXX_FLAGS};${CMAKE_CXX_FLAGS_${type}};${Torch_VERSION};${TORCH_INCLUDE_DIRS};${HEARTH_HAS_CUDA}")
  foreach(input IN LISTS ARGN)
    if(IS_ABSOLUTE "${input}" AND EXISTS "${input}")
      set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${input}")
      file(SHA256 "${input}" h)
      string(APPEND sum ";${h}")
    else()
      string(APPEND sum ";${input}")
    endif()
  endforeach()
  string(SHA256 sum "${sum}")
  file(WRITE ${CMAKE_BINARY_DIR}/CMakeFiles/${target}.dir/cmake_pch.hxx.gch.sum "${sum}\n")
endfunction()
