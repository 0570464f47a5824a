# fsdp_add_checkpoint_library(<target> MODEL <model.json>
#                             [MESH <name=size,...>] [PLACEMENTS <shard|replicate,...>]
#                             [SYMBOL_PREFIX <P>] [NAMESPACE <NS>])
#
# A library <target> of the checkpoint code of one model description
# (fsdp-model-v1 JSON), generated at build time and again whenever the JSON
# (or a tool) changes:
#   fsdp-translate --import-model-json <json> [--mesh=MESH] [--placements=PLACEMENTS]
#   fsdp-opt --fsdp-lower-fully-shard
#   fsdp-translate --emit-cpp --emit-cpp-header <target>.h --cpp-symbol-prefix P
#                  --cpp-namespace NS
# into ${CMAKE_CURRENT_BINARY_DIR}/<target>.fsdp/. It links the runtime
# (FsdpMlir::runtime) and puts <target>.h on its users' include path. Each
# keyword takes one value, commas inside (MESH dp_outer=2,dp_shard=4). P
# defaults to <target> made a C identifier, NS to P. docs/Embedding.md.
function(fsdp_add_checkpoint_library target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "MODEL;MESH;PLACEMENTS;SYMBOL_PREFIX;NAMESPACE" "")
  if(arg_UNPARSED_ARGUMENTS OR arg_KEYWORDS_MISSING_VALUES)
    message(FATAL_ERROR "fsdp_add_checkpoint_library(${target}): unexpected "
      "'${arg_UNPARSED_ARGUMENTS}${arg_KEYWORDS_MISSING_VALUES}': each of MODEL, MESH, "
      "PLACEMENTS, SYMBOL_PREFIX and NAMESPACE takes one value (commas inside: MESH dp=2,tp=4)")
  endif()
  if(NOT arg_MODEL)
    message(FATAL_ERROR "fsdp_add_checkpoint_library(${target}): MODEL <model.json> is required")
  endif()

  # The tools: the installed package's, or this build's.
  if(TARGET FsdpMlir::fsdp-translate AND TARGET FsdpMlir::fsdp-opt)
    set(translate FsdpMlir::fsdp-translate)
    set(opt FsdpMlir::fsdp-opt)
  elseif(TARGET fsdp-translate AND TARGET fsdp-opt)
    set(translate fsdp-translate)
    set(opt fsdp-opt)
  else()
    message(FATAL_ERROR "fsdp_add_checkpoint_library(${target}): needs fsdp-translate and "
      "fsdp-opt: install the package's tools component from a build with "
      "FSDP_BUILD_COMPILER=ON")
  endif()
  if(TARGET FsdpMlir::runtime)
    set(runtime FsdpMlir::runtime)
  else()
    set(runtime fsdp_runtime_shared)
  endif()

  get_filename_component(model "${arg_MODEL}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  if(arg_SYMBOL_PREFIX)
    set(prefix "${arg_SYMBOL_PREFIX}")
  else()
    string(MAKE_C_IDENTIFIER "${target}" prefix)
  endif()
  if(arg_NAMESPACE)
    set(namespace "${arg_NAMESPACE}")
  else()
    set(namespace "${prefix}")
  endif()
  set(import_options)
  if(arg_MESH)
    list(APPEND import_options "--mesh=${arg_MESH}")
  endif()
  if(arg_PLACEMENTS)
    list(APPEND import_options "--placements=${arg_PLACEMENTS}")
  endif()

  set(dir "${CMAKE_CURRENT_BINARY_DIR}/${target}.fsdp")
  set(imported "${dir}/model.mlir")
  set(lowered "${dir}/lowered.mlir")
  set(source "${dir}/${target}.cpp")
  set(header "${dir}/${target}.h")
  set(plans "${dir}/${target}.plans.bin")
  file(MAKE_DIRECTORY "${dir}")
  add_custom_command(
    OUTPUT "${imported}"
    COMMAND ${translate} --import-model-json "${model}" ${import_options} -o "${imported}"
    DEPENDS "${model}" ${translate}
    COMMENT "Importing ${arg_MODEL} for ${target}"
    VERBATIM)
  add_custom_command(
    OUTPUT "${lowered}"
    COMMAND ${opt} "${imported}" --fsdp-lower-fully-shard -o "${lowered}"
    DEPENDS "${imported}" ${opt}
    COMMENT "Lowering ${target}'s model to its FSDP layout"
    VERBATIM)
  add_custom_command(
    OUTPUT "${source}" "${header}" "${plans}"
    COMMAND ${translate} --emit-cpp "${lowered}" -o "${source}" "--emit-cpp-header=${header}"
            "--cpp-symbol-prefix=${prefix}" "--cpp-namespace=${namespace}"
            "--cpp-plan-file=${plans}"
    DEPENDS "${lowered}" ${translate}
    COMMENT "Generating ${target}'s checkpoint code and plans"
    VERBATIM)
  # The source embeds the plans with .incbin: rebuild it when they change.
  set_source_files_properties("${source}" PROPERTIES OBJECT_DEPENDS "${plans}")

  add_library(${target} "${source}" "${header}")
  target_include_directories(${target} PUBLIC "$<BUILD_INTERFACE:${dir}>")
  target_link_libraries(${target} PUBLIC ${runtime})
  target_compile_features(${target} PUBLIC cxx_std_17)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()
