//===- TranslateToCpp.cpp - Emit a model's checkpoint library as C++ ------===//
//
// `--emit-cpp`: the C++ of one lowered model's checkpoint library
// (docs/Embedding.md). Three files:
//
//   - the plan bytes (`--cpp-plan-file`, by default the output's name with
//     `.plans.bin`): every rank's plan file as `--plan-split-dir` writes them,
//     one after another, each 8-byte aligned. Rank r's is found through a
//     table in the source, so it reads (and copies) nothing of the others';
//   - the header (`--emit-cpp-header`, C and C++): the model's summary, named
//     tables of every rank's buffers, the C entry point `<prefix>_open` and a
//     small C++ API over the runtime (namespace `--cpp-namespace`);
//   - the source (the output): the rank table, the definitions, and the plan
//     bytes pulled into a read-only section by the assembler's `.incbin` of
//     the plan file's absolute path. No C++ initialiser holds plan bytes, so
//     a world of 16,384 ranks (gigabytes of plans) compiles as fast as the
//     assembler copies a file.
//
// Without `--emit-cpp-header` the declarations go at the top of the source.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Dialect/FSDP/IR/FSDPUtils.h"
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Support/Escape.h"
#include "fsdp/Target/CheckpointPlan.h"
#include "fsdp/Target/Cpp.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace fsdp;

namespace {

//===----------------------------------------------------------------------===//
// Names and spellings
//===----------------------------------------------------------------------===//

// Everything from the model or the command line that reaches the generated
// files goes through exactly one of the functions of this section: names that
// become C or C++ identifiers are checked (identifierProblem, namespaceProblem,
// prefixProblem), the header's name is checked (includeNameProblem), and any
// other text is written as a comment (commentText) or a string literal
// (stringLiteral, asmString). The generated code compiles warning-free for any
// name these accept.

/// C and C++ keywords, alternative tokens included (C++ `and`, C's
/// <iso646.h> macros) and C23's: not one may be an identifier of the
/// generated code, which is both C and C++.
bool isKeyword(StringRef name) {
  static constexpr StringLiteral kKeywords =
      "_Alignas _Alignof _Atomic _BitInt _Bool _Complex _Decimal128 _Decimal32 _Decimal64 "
      "_Generic _Imaginary _Noreturn _Static_assert _Thread_local alignas alignof and and_eq "
      "asm auto bitand bitor bool break case catch char char16_t char32_t char8_t class "
      "co_await co_return co_yield compl concept const const_cast consteval constexpr "
      "constinit continue decltype default delete do double dynamic_cast else enum explicit "
      "export extern false float for friend goto if inline int long mutable namespace new "
      "noexcept not not_eq nullptr operator or or_eq private protected public register "
      "reinterpret_cast requires restrict return short signed sizeof static static_assert "
      "static_cast struct switch template this thread_local throw true try typedef typeid "
      "typename typeof typeof_unqual union unsigned using virtual void volatile wchar_t "
      "while xor xor_eq";
  SmallVector<StringRef> keywords;
  kKeywords.split(keywords, ' ');
  return llvm::is_contained(keywords, name);
}

enum class IdentifierProblem { None, Syntax, Keyword, Reserved };

/// Whether `name` can be an identifier of the generated code: letters,
/// digits and '_', not a keyword, and not one of those the standards reserve
/// for the compiler and its library (whose macros, such as __linux__ or
/// _GNU_SOURCE, would replace it).
IdentifierProblem identifierProblem(StringRef name) {
  if (name.empty() || !(llvm::isAlpha(name[0]) || name[0] == '_') ||
      !llvm::all_of(name, [](char c) { return llvm::isAlnum(c) || c == '_'; }))
    return IdentifierProblem::Syntax;
  if (isKeyword(name))
    return IdentifierProblem::Keyword;
  if (name.contains("__") || (name.size() > 1 && name[0] == '_' && llvm::isUpper(name[1])))
    return IdentifierProblem::Reserved;
  return IdentifierProblem::None;
}

constexpr const char *kReservedText =
    "reserved to the compiler and the standard library (names holding '__' or starting with "
    "'_' and a capital letter)";

/// What "--cpp-symbol-prefix must" be when `prefix` cannot be the symbol
/// prefix, or "".
std::string prefixProblem(StringRef prefix) {
  // The macros are the prefix in capitals: `_x` makes the reserved `_X_...`.
  IdentifierProblem problem = identifierProblem(prefix);
  if (problem == IdentifierProblem::None &&
      identifierProblem(prefix.upper()) == IdentifierProblem::Reserved)
    problem = IdentifierProblem::Reserved;
  switch (problem) {
  case IdentifierProblem::Syntax:
    return "be a C identifier";
  case IdentifierProblem::Keyword:
    return "not be a C or C++ keyword";
  case IdentifierProblem::Reserved:
    return std::string("not be an identifier ") + kReservedText;
  case IdentifierProblem::None:
    break;
  }
  if (prefix == "fsdp")
    return "not be 'fsdp' (it would define fsdp_open, a function of the runtime's C API)";
  return "";
}

/// What "--cpp-namespace must" be when `ns` cannot be the C++ namespace, or
/// "". Besides identifiers, the namespace cannot reuse a name the generated
/// code means otherwise: one it names unqualified inside the namespace (any
/// component would hide it), or, for the outermost component, one the source
/// defines at global scope. (Names the C and C++ libraries declare, such as
/// memcpy or NULL, are the caller's to avoid.)
std::string namespaceProblem(StringRef ns, StringRef prefix) {
  static const char *const usedInside[] = {"fsdp",     "std",      "size_t",  "int8_t",
                                           "int16_t",  "int32_t",  "int64_t", "uint8_t",
                                           "uint16_t", "uint32_t", "uint64_t"};
  static const char *const sourceGlobals[] = {"report", "kLibraryName", "kPlanBytes",
                                              "RankPlanSpan", "kRankPlans"};
  static const char *const prefixed[] = {"buffers", "buffer_elements", "element_size", "rank_plan",
                                         "open",    "plan_bytes",      "plan_size"};
  SmallVector<StringRef> parts;
  ns.split(parts, "::");
  for (auto [index, part] : llvm::enumerate(parts)) {
    switch (identifierProblem(part)) {
    case IdentifierProblem::Syntax:
      return "be a C++ namespace (identifiers joined by '::')";
    case IdentifierProblem::Keyword:
      return "not hold '" + part.str() + "', a C or C++ keyword";
    case IdentifierProblem::Reserved:
      return "not hold '" + part.str() + "', an identifier " + kReservedText;
    case IdentifierProblem::None:
      break;
    }
    if (llvm::is_contained(usedInside, part))
      return "not hold '" + part.str() + "', which the generated code uses unqualified";
    bool global = index == 0 && (llvm::is_contained(sourceGlobals, part) ||
                                 llvm::any_of(prefixed, [&](StringRef name) {
                                   return part == (prefix + "_" + name).str();
                                 }));
    if (global)
      return "not start with '" + part.str() + "', which the source defines at global scope";
  }
  return "";
}

/// Non-ASCII code points a compiler warns about or an editor shows as a line
/// break, even inside a comment: C1 controls, bidirectional controls (GCC's
/// -Wbidi-chars), line and paragraph separators, noncharacters.
bool isUnsafeInSource(uint32_t code) {
  return (code >= 0x80 && code < 0xA0) || code == 0x061C || code == 0x200E || code == 0x200F ||
         (code >= 0x2028 && code <= 0x202E) || (code >= 0x2066 && code <= 0x2069) ||
         isNoncharacter(code);
}

/// What the file name in `#include "..."` must be when `name` cannot be
/// one, or "". A header name has no escapes: the preprocessor looks up what
/// it holds as written.
std::string includeNameProblem(StringRef name) {
  for (size_t at = 0; at < name.size();) {
    auto c = static_cast<uint8_t>(name[at]);
    uint32_t code = c;
    size_t length = c < 0x80 ? 1 : decodeUtf8(name, at, code);
    if (length == 0)
      return "be valid UTF-8";
    if (code < 0x20 || code == 0x7F || isUnsafeInSource(code))
      return "not hold control characters or code points compilers warn about";
    if (c == '"' || c == '\'' || c == '\\')
      return "not hold quotes or backslashes (an #include cannot escape them)";
    if (c == '?' && at + 1 < name.size() && name[at + 1] == '?')
      return "not hold '?\?' (a trigraph in C; a warning in C++)";
    at += length;
  }
  return "";
}

/// Text from the model or the command line inside a `//` or `/* */`
/// comment: it can neither end the comment nor start a nested one, nor
/// splice the next line into it, nor hold a line break or a control
/// character. Written as \xNN: control bytes, invalid UTF-8, `\`, the second
/// `?` of `??` (a trigraph in C), a `/` next to a `*`, and a `/` or `*` at
/// either end (so neither pairs with the text around it); as \u{XXXX}: the
/// code points of isUnsafeInSource.
std::string commentText(StringRef text) {
  std::string out;
  out.reserve(text.size());
  for (size_t at = 0; at < text.size();) {
    auto c = static_cast<uint8_t>(text[at]);
    if (c >= 0x80) {
      uint32_t code = 0;
      if (size_t length = decodeUtf8(text, at, code)) {
        if (isUnsafeInSource(code))
          appendCodePointEscape(out, code);
        else
          out.append(text.substr(at, length));
        at += length;
      } else {
        appendByteEscape(out, c);
        ++at;
      }
      continue;
    }
    bool atEnd = at == 0 || at + 1 == text.size();
    bool nextToStar =
        (at > 0 && text[at - 1] == '*') || (at + 1 < text.size() && text[at + 1] == '*');
    if (c < 0x20 || c == 0x7F || c == '\\' || (c == '?' && at > 0 && text[at - 1] == '?') ||
        (c == '/' && (atEnd || nextToStar)) || (c == '*' && atEnd))
      appendByteEscape(out, c);
    else
      out += static_cast<char>(c);
    ++at;
  }
  return out;
}

/// `\ooo`: three octal digits, so the escape ends there whatever follows (a
/// hex escape would run on into following hex digits).
void appendOctalEscape(std::string &out, uint8_t byte) {
  out += '\\';
  out += static_cast<char>('0' + ((byte >> 6) & 7));
  out += static_cast<char>('0' + ((byte >> 3) & 7));
  out += static_cast<char>('0' + (byte & 7));
}

/// A C/C++ string literal of `text`, any bytes, in plain ASCII: printable
/// ASCII as it is but for `"`, `\` and the second `?` of `??` (a trigraph in
/// C), escaped with a backslash; a newline as \n; every other byte in octal.
std::string stringLiteral(StringRef text) {
  std::string out = "\"";
  for (size_t at = 0; at < text.size(); ++at) {
    auto c = static_cast<uint8_t>(text[at]);
    if (c == '"' || c == '\\' || (c == '?' && at > 0 && text[at - 1] == '?')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      appendOctalEscape(out, c);
    }
  }
  return out + "\"";
}

/// An assembler string (`.incbin "<path>"`), any bytes, with the escapes the
/// GNU assembler and Clang's both read: `\"`, `\\` and every byte that is not
/// printable ASCII in octal. It reaches the source through stringLiteral.
std::string asmString(StringRef text) {
  std::string out = "\"";
  for (char ch : text) {
    auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c >= 0x20 && c < 0x7F) {
      out += ch;
    } else {
      appendOctalEscape(out, c);
    }
  }
  return out + "\"";
}

struct RoleSpelling {
  const char *cxx;   // Role::MainWeight, buffers::Group0MainWeight
  const char *upper; // FSDP_MAIN_WEIGHT, <PREFIX>_GROUP0_MAIN_WEIGHT
};

RoleSpelling roleSpelling(plan::BufferRole role) {
  switch (role) {
  case plan::BufferRole::MainWeight:
    return {"MainWeight", "MAIN_WEIGHT"};
  case plan::BufferRole::ModelWeight:
    return {"ModelWeight", "MODEL_WEIGHT"};
  case plan::BufferRole::MainGrad:
    return {"MainGrad", "MAIN_GRAD"};
  case plan::BufferRole::ExpAvg:
    return {"ExpAvg", "EXP_AVG"};
  case plan::BufferRole::ExpAvgSq:
    return {"ExpAvgSq", "EXP_AVG_SQ"};
  case plan::BufferRole::MaxExpAvgSq:
    return {"MaxExpAvgSq", "MAX_EXP_AVG_SQ"};
  case plan::BufferRole::MomentumBuffer:
    return {"MomentumBuffer", "MOMENTUM_BUFFER"};
  }
  return {"MainWeight", "MAIN_WEIGHT"};
}

struct DTypeSpelling {
  const char *enumerator; // fsdp::dcp::DType::<enumerator>
  const char *element;    // the C++ element type a buffer is an array of
};

DTypeSpelling dtypeSpelling(dcp::DType dtype) {
  switch (dtype) {
  case dcp::DType::Float64:
    return {"Float64", "double"};
  case dcp::DType::Float32:
    return {"Float32", "float"};
  case dcp::DType::Float16:
    return {"Float16", "uint16_t"};
  case dcp::DType::BFloat16:
    return {"BFloat16", "uint16_t"};
  case dcp::DType::Int64:
    return {"Int64", "int64_t"};
  case dcp::DType::Int32:
    return {"Int32", "int32_t"};
  case dcp::DType::Int16:
    return {"Int16", "int16_t"};
  case dcp::DType::Int8:
    return {"Int8", "int8_t"};
  case dcp::DType::UInt8:
    return {"UInt8", "uint8_t"};
  case dcp::DType::Bool:
    return {"Bool", "uint8_t"};
  default:
    // Plans hold only the types above (lib/Target/CheckpointPlan).
    return {nullptr, "unsigned char"};
  }
}

/// The dtype as the model JSON names it (FSDPDTypes.cpp), for comments.
StringRef dtypeBrief(dcp::DType dtype) {
  StringRef name = getDTypeName(dtype);
  return name.empty() ? StringRef("?") : name;
}

std::string upper(StringRef text) { return text.upper(); }

/// "1 rank", "2 ranks".
std::string count(size_t n, StringRef noun) {
  return std::to_string(n) + " " + noun.str() + (n == 1 ? "" : "s");
}

//===----------------------------------------------------------------------===//
// What the files say
//===----------------------------------------------------------------------===//

struct BufferRow {
  int32_t group = 0;
  plan::BufferRole role = plan::BufferRole::MainWeight;
  dcp::DType dtype = dcp::DType::Float32;
  int64_t elements = 0;
  bool aliasesMainWeight = false;

  std::string typeName() const { return "Group" + std::to_string(group) + roleSpelling(role).cxx; }
  std::string enumName(StringRef prefixUpper) const {
    return (prefixUpper + "_GROUP" + Twine(group) + "_" + roleSpelling(role).upper).str();
  }
  int64_t bytes() const { return elements * dcp::dtypeInfo(dtype).elementSize; }
};

struct RankSpan {
  uint64_t offset = 0, size = 0;
};

struct Library {
  const plan::ModelLayout *layout = nullptr;
  std::string prefix, prefixUpper, ns;
  std::string modelName;          // @model
  std::string source;             // the IR file the model came from
  std::string planPath;           // absolute: what .incbin reads
  std::string headerName;         // what the source includes; empty: inline
  std::string outputName;         // the source's file name, for its banner
  std::vector<BufferRow> buffers; // one rank's, in plan order (all equal)
  std::vector<RankSpan> ranks;    // where each rank's plan file lies
  uint64_t planBytes = 0;         // the plan file's size
  uint64_t planId = 0;
  uint32_t planVersion = 0;

  int64_t worldSize() const { return layout->worldSize(); }
  std::string sym(StringRef name) const { return prefix + "_" + name.str(); }
  std::string macro(StringRef name) const { return prefixUpper + "_" + name.str(); }
};

std::string meshText(const plan::ModelLayout &layout) {
  std::string text;
  for (size_t axis = 0; axis < layout.meshSizes.size(); ++axis)
    text += (axis ? "," : "") + layout.meshAxisNames[axis] + "=" +
            std::to_string(layout.meshSizes[axis]);
  return text;
}

std::string placementsText(const std::vector<layout::Placement> &placements) {
  std::string text = "[";
  for (size_t i = 0; i < placements.size(); ++i)
    text += std::string(i ? ", " : "") +
            (placements[i] == layout::Placement::Shard ? "shard" : "replicate");
  return text + "]";
}

/// The banner every file starts with: `//===- name - what -----===//` as the
/// rest of the repository, in C comment form for the header. The file's name
/// and the model's are written with commentText.
void writeBanner(raw_ostream &os, StringRef name, StringRef modelName, bool cComment) {
  std::string head = (cComment ? "/*===- " : "//===- ") + commentText(name) +
                     " - Checkpoint library of " + commentText(modelName) + " (generated) ";
  std::string tail = cComment ? "-===*" : "-===//";
  os << head;
  for (size_t width = head.size() + tail.size(); width < 80; ++width)
    os << '-';
  os << tail << "\n";
}

/// The summary at the top of the header: model, mesh, layout, plan.
void writeSummary(raw_ostream &os, const Library &lib, StringRef lead) {
  const plan::ModelLayout &layout = *lib.layout;
  os << lead << "\n"
     << lead << " Generated by `fsdp-translate --emit-cpp` from " << commentText(lib.source)
     << ": do not edit.\n"
     << lead << "\n"
     << lead << " Model:  " << commentText(lib.modelName) << ", " << layout.groups.size()
     << (layout.groups.size() == 1 ? " parameter group" : " parameter groups");
  size_t tensors = 0;
  for (const plan::GroupSpec &group : layout.groups)
    tensors += group.members.size();
  os << ", " << count(tensors, "tensor") << "; optimizer ";
  if (layout.optimizer.present)
    os << optimizerKindName(layout.optimizer.kind) << " (state "
       << dtypeBrief(layout.optimizer.stateDtype) << ")\n";
  else
    os << "none\n";
  os << lead << " Mesh:   " << commentText(meshText(layout)) << " ("
     << count(lib.worldSize(), "rank") << ", one process each)\n";
  int64_t rankBytes = 0;
  for (const BufferRow &row : lib.buffers)
    rankBytes += row.aliasesMainWeight ? 0 : row.bytes();
  os << lead << " Layout: Megatron-FSDP packed buffers; every rank holds " << lib.buffers.size()
     << " buffers, " << rankBytes << " bytes:\n";
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const plan::GroupSpec &group = layout.groups[g];
    os << lead << "   group " << g << ": unit \"" << commentText(group.unit) << "\", "
       << dtypeBrief(group.dtype) << (group.requiresGrad ? " trainable" : " frozen")
       << ", " << count(group.members.size(), "tensor") << ", " << placementsText(group.placements)
       << ", " << group.size << " elements, " << group.shardSize << " per rank: ";
    for (size_t b = 0; b < group.buffers.size(); ++b)
      os << (b ? ", " : "") << plan::bufferRoleName(group.buffers[b].role) << " "
         << dtypeBrief(group.buffers[b].dtype)
         << (group.buffers[b].aliasesMainWeight ? " (aliases main_weight)" : "");
    os << "\n";
  }
  os << lead << " Plan:   format version " << lib.planVersion << ", id "
     << llvm::format_hex(lib.planId, 18) << ": " << count(lib.worldSize(), "per-rank plan file")
     << " (as --plan-split-dir writes them), " << lib.planBytes << " bytes,\n"
     << lead << "         embedded from " << commentText(llvm::sys::path::filename(lib.planPath))
     << " by the assembler (.incbin); a rank reads only its own.\n"
     << lead << "\n"
     << lead << " C: " << lib.sym("open") << " (below), then the C API of fsdp_runtime.h.\n"
     << lead << " C++: namespace " << lib.ns << " (below): constants, buffer types, "
     << "Checkpoint.\n"
     << lead << "\n";
}

//===----------------------------------------------------------------------===//
// The header
//===----------------------------------------------------------------------===//

void writeDeclarations(raw_ostream &os, const Library &lib) {
  std::string guard = "FSDP_GENERATED_" + lib.prefixUpper + "_H";
  os << "#ifndef " << guard << "\n#define " << guard << "\n\n"
     << "#include \"fsdp/Runtime/fsdp_runtime.h\"\n\n"
     << "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n";

  os << "#define " << lib.macro("WORLD_SIZE") << " " << lib.worldSize() << "\n"
     << "#define " << lib.macro("GROUP_COUNT") << " " << lib.layout->groups.size() << "\n"
     << "#define " << lib.macro("BUFFER_COUNT") << " " << lib.buffers.size() << "\n\n";

  os << "/* Indices into " << lib.sym("buffers") << ", by group and role. */\nenum {\n";
  for (size_t i = 0; i < lib.buffers.size(); ++i)
    os << "  " << lib.buffers[i].enumName(lib.prefixUpper) << " = " << i << ",\n";
  os << "  " << lib.macro("BUFFER_INDEX_END") << " = " << lib.buffers.size() << "\n};\n\n";

  os << "/* Every buffer a rank holds, in plan order (fsdp_buffer_info_at's): each\n"
     << " * group's shard in each role. Every rank holds the same buffers. */\n"
     << "extern const fsdp_buffer_info " << lib.sym("buffers") << "[" << lib.macro("BUFFER_COUNT")
     << "];\n\n"
     << "/* Elements of (group, role) on `rank`: 0 when no buffer has that group and\n"
     << " * role, -1 for a rank outside the mesh. */\n"
     << "int64_t " << lib.sym("buffer_elements")
     << "(int64_t rank, int32_t group, int32_t role);\n\n"
     << "/* Bytes of one element of `dtype` (fsdp_buffer_info.dtype); 0 if unknown. */\n"
     << "size_t " << lib.sym("element_size") << "(int32_t dtype);\n\n"
     << "/* `rank`'s plan file as embedded (a FlatBuffers plan file, docs/PlanFile.md:\n"
     << " * what --plan-split-dir writes as rank-<rank>.fsdpplan); `size` gets its\n"
     << " * size. NULL for a rank outside the mesh. */\n"
     << "const void *" << lib.sym("rank_plan") << "(int64_t rank, size_t *size);\n\n"
     << "/* Opens the embedded plan for this process's rank: over MPI_COMM_WORLD in a\n"
     << " * process started by mpirun (initialising MPI if needed, finalising it at\n"
     << " * exit), as a world of one otherwise. With `allocate`, the runtime allocates\n"
     << " * every buffer, zeroed; otherwise bind each with fsdp_bind_buffer. Returns\n"
     << " * FSDP_OK, or the code of the error's kind with one line in `error`. Close\n"
     << " * with fsdp_close. */\n"
     << "int " << lib.sym("open")
     << "(int allocate, fsdp_checkpointer **out, char *error, size_t error_size);\n\n"
     << "#ifdef __cplusplus\n} /* extern \"C\" */\n#endif\n\n";

  // C++.
  os << "#ifdef __cplusplus\n"
     << "#include \"fsdp/Runtime/Checkpointer.h\"\n\n"
     << "#include <cstdint>\n#include <memory>\n#include <string>\n#include <string_view>\n\n"
     << "namespace " << lib.ns << " {\n\n";
  os << "/// The mesh this library was generated for: one process per rank.\n"
     << "inline constexpr int64_t kWorldSize = " << lib.worldSize() << ";\n"
     << "inline constexpr const char *kMeshAxisNames[] = {";
  for (size_t axis = 0; axis < lib.layout->meshAxisNames.size(); ++axis)
    os << (axis ? ", " : "") << stringLiteral(lib.layout->meshAxisNames[axis]);
  os << "};\ninline constexpr int64_t kMeshSizes[] = {";
  for (size_t axis = 0; axis < lib.layout->meshSizes.size(); ++axis)
    os << (axis ? ", " : "") << lib.layout->meshSizes[axis];
  os << "};\n"
     << "/// The plan's identity (PlanFile::planId): a checkpoint's .fsdp-index names it.\n"
     << "inline constexpr uint64_t kPlanId = " << llvm::format_hex(lib.planId, 18) << "ull;\n\n";

  os << "/// Buffer roles, as in the plan and the C API.\n"
     << "enum class Role : int32_t {\n"
     << "  MainWeight = FSDP_MAIN_WEIGHT,\n  ModelWeight = FSDP_MODEL_WEIGHT,\n"
     << "  MainGrad = FSDP_MAIN_GRAD,\n  ExpAvg = FSDP_EXP_AVG,\n"
     << "  ExpAvgSq = FSDP_EXP_AVG_SQ,\n  MaxExpAvgSq = FSDP_MAX_EXP_AVG_SQ,\n"
     << "  MomentumBuffer = FSDP_MOMENTUM_BUFFER,\n};\n"
     << "using DType = fsdp::dcp::DType;\n\n"
     << "/// One buffer every rank holds: a group's shard in one role.\n"
     << "struct BufferInfo {\n  int32_t group;\n  Role role;\n  DType dtype;\n"
     << "  int64_t elements; // per rank\n  int64_t bytes;    // per rank\n"
     << "  bool aliasesMainWeight;\n};\n\n";

  os << "/// Each buffer as a type, for Checkpoint::data<B>() and bind<B>(): its group,\n"
     << "/// role, element type and size at compile time. f16 and bf16 elements are\n"
     << "/// their bits (uint16_t); bool elements are bytes.\n"
     << "namespace buffers {\n";
  int32_t lastGroup = -1;
  for (const BufferRow &row : lib.buffers) {
    if (row.group != lastGroup) {
      const plan::GroupSpec &group = lib.layout->groups[row.group];
      os << "\n// Group " << row.group << ": unit \"" << commentText(group.unit) << "\", "
         << dtypeBrief(group.dtype) << (group.requiresGrad ? " trainable" : " frozen")
         << ", " << count(group.members.size(), "tensor") << ".\n";
      lastGroup = row.group;
    }
    DTypeSpelling dtype = dtypeSpelling(row.dtype);
    os << "struct " << row.typeName() << " {\n"
       << "  static constexpr int32_t group = " << row.group << ";\n"
       << "  static constexpr Role role = Role::" << roleSpelling(row.role).cxx << ";\n"
       << "  static constexpr DType dtype = DType::" << dtype.enumerator << ";\n"
       << "  using Element = " << dtype.element << ";\n"
       << "  static constexpr int64_t elements = " << row.elements << ";\n"
       << "  static constexpr bool aliasesMainWeight = "
       << (row.aliasesMainWeight ? "true" : "false") << ";\n};\n";
  }
  os << "\n} // namespace buffers\n\n";

  os << "/// Every buffer a rank holds, in plan order.\n"
     << "inline constexpr BufferInfo kBuffers[] = {\n";
  for (const BufferRow &row : lib.buffers)
    os << "    {" << row.group << ", Role::" << roleSpelling(row.role).cxx
       << ", DType::" << dtypeSpelling(row.dtype).enumerator << ", " << row.elements << ", "
       << row.bytes() << ", " << (row.aliasesMainWeight ? "true" : "false")
       << "}, // buffers::" << row.typeName() << "\n";
  os << "};\n\n";

  os << "/// Elements of (group, role) on `rank`: 0 when no buffer has that group and\n"
     << "/// role, -1 for a rank outside the mesh.\n"
     << "int64_t bufferElements(int64_t rank, int32_t group, Role role);\n"
     << "/// `rank`'s embedded plan file (empty outside the mesh).\n"
     << "std::string_view rankPlan(int64_t rank);\n\n";

  os << "/// One rank of this model: the embedded plan opened for a communicator's\n"
     << "/// rank, with its buffers. Everything else is fsdp::runtime::Checkpointer's\n"
     << "/// (runtime()).\n"
     << "class Checkpoint {\n"
     << "public:\n"
     << "  /// Opens for this process's rank: MPI_COMM_WORLD under mpirun (MPI\n"
     << "  /// initialised if needed, finalised at exit), a world of one otherwise.\n"
     << "  /// With `allocate`, the runtime allocates every buffer, zeroed; otherwise\n"
     << "  /// bind each before a save or load.\n"
     << "  static fsdp::Result<Checkpoint> open(bool allocate = true);\n"
     << "  /// The same over `comm` (fsdp/Runtime/Communicator.h).\n"
     << "  static fsdp::Result<Checkpoint> open(std::unique_ptr<fsdp::runtime::Communicator> "
        "comm,\n"
     << "                                       bool allocate = true);\n\n"
     << "  int64_t rank() const { return runtime_->rank(); }\n"
     << "  /// A buffer's memory (allocated or bound), or null.\n"
     << "  void *data(int32_t group, Role role);\n"
     << "  template <class B> typename B::Element *data() {\n"
     << "    return static_cast<typename B::Element *>(data(B::group, B::role));\n  }\n"
     << "  /// Caller-owned memory for one buffer (at least its bytes), no copy.\n"
     << "  fsdp::Status bind(int32_t group, Role role, void *memory);\n"
     << "  template <class B> fsdp::Status bind(typename B::Element *memory) {\n"
     << "    return bind(B::group, B::role, memory);\n  }\n\n"
     << "  fsdp::Result<fsdp::runtime::TransferStats> save(const std::string &dir,\n"
     << "                                                  fsdp::runtime::SaveOptions "
        "options = {});\n"
     << "  /// Any DCP checkpoint of this model, from any mesh, into this layout.\n"
     << "  fsdp::Result<fsdp::runtime::LoadResult> load(const std::string &dir,\n"
     << "                                               fsdp::runtime::LoadOptions "
        "options = {});\n"
     << "  /// The deterministic test values (docs/TestValues.md).\n"
     << "  fsdp::Status fill(uint32_t seed);\n"
     << "  fsdp::Status check(uint32_t seed);\n\n"
     << "  fsdp::runtime::Checkpointer &runtime() { return *runtime_; }\n"
     << "  /// Hands the checkpointer to the C API (fsdp_close frees it); this\n"
     << "  /// Checkpoint is empty afterwards. Null when out of memory.\n"
     << "  fsdp_checkpointer *release();\n\n"
     << "private:\n"
     << "  explicit Checkpoint(std::unique_ptr<fsdp::runtime::Checkpointer> runtime)\n"
     << "      : runtime_(std::move(runtime)) {}\n"
     << "  std::unique_ptr<fsdp::runtime::Checkpointer> runtime_;\n"
     << "};\n\n"
     << "} // namespace " << lib.ns << "\n"
     << "#endif // __cplusplus\n\n"
     << "#endif /* " << guard << " */\n";
}

void writeHeader(raw_ostream &os, const Library &lib, StringRef name) {
  writeBanner(os, name, lib.modelName, true);
  writeSummary(os, lib, " *");
  os << " *===" << std::string(71, '-') << "===*/\n";
  writeDeclarations(os, lib);
}

//===----------------------------------------------------------------------===//
// The source
//===----------------------------------------------------------------------===//

void writeSource(raw_ostream &os, const Library &lib) {
  if (lib.headerName.empty()) {
    writeHeader(os, lib, lib.outputName);
    os << "\n";
  } else {
    writeBanner(os, lib.outputName, lib.modelName, false);
    os << "//\n// Generated by `fsdp-translate --emit-cpp`: do not edit. The model, its mesh\n"
       << "// and layout are summarized in " << commentText(lib.headerName) << ".\n//\n"
       << "//===" << std::string(70, '-') << "===//\n"
       << "#include \"" << lib.headerName << "\"\n\n"; // as written: includeNameProblem
  }
  std::string bytesSym = lib.sym("plan_bytes"), sizeSym = lib.sym("plan_size");
  std::string section = ".lrodata." + lib.sym("plan");
  os << "#include \"fsdp/Runtime/CHandle.h\"\n\n"
     << "#include <cstring>\n\n"
     << "#if !defined(__ELF__)\n"
     << "#error \"the embedded plan needs an ELF target (the assembler's .incbin)\"\n"
     << "#endif\n\n";

  os << "// The plan bytes: every rank's plan file, 8-byte aligned, read by the\n"
     << "// assembler from the file fsdp-translate wrote with this one (by its absolute\n"
     << "// path). They go to a large read-only section (x86-64's .lrodata, after code\n"
     << "// and data), so a large world's gigabytes of plans crowd nothing the code\n"
     << "// addresses relative to itself. " << sizeSym << " is their size as assembled.\n"
     << "#if defined(__x86_64__) && (!defined(__clang__) || __clang_major__ >= 17)\n"
     << "#define " << lib.macro("PLAN_SECTION_FLAGS") << " \"\\\"al\\\"\"\n"
     << "#else\n"
     << "#define " << lib.macro("PLAN_SECTION_FLAGS") << " \"\\\"a\\\"\"\n"
     << "#endif\n"
     << "asm(\".pushsection " << section << ",\" " << lib.macro("PLAN_SECTION_FLAGS")
     << " \",%progbits\\n\"\n"
     << "    \".balign 64\\n\"\n"
     << "    \".globl " << bytesSym << "\\n\"\n"
     << "    \".hidden " << bytesSym << "\\n\"\n"
     << "    \".type " << bytesSym << ", %object\\n\"\n"
     << "    \"" << bytesSym << ":\\n\"\n"
     << "    " << stringLiteral(".incbin " + asmString(lib.planPath) + "\n") << "\n"
     << "    \"" << bytesSym << "_end:\\n\"\n"
     << "    \".size " << bytesSym << ", " << bytesSym << "_end - " << bytesSym << "\\n\"\n"
     << "    \".popsection\\n\"\n"
     // The size in ordinary read-only data, near the code that reads it
     // (past gigabytes of plans, a 32-bit relative address would not reach).
     << "    \".pushsection .rodata." << sizeSym << ",\\\"a\\\",%progbits\\n\"\n"
     << "    \".balign 8\\n\"\n"
     << "    \".globl " << sizeSym << "\\n\"\n"
     << "    \".hidden " << sizeSym << "\\n\"\n"
     << "    \".type " << sizeSym << ", %object\\n\"\n"
     << "    \"" << sizeSym << ":\\n\"\n"
     << "    \".quad " << bytesSym << "_end - " << bytesSym << "\\n\"\n"
     << "    \".size " << sizeSym << ", 8\\n\"\n"
     << "    \".popsection\\n\");\n"
     << "extern \"C\" __attribute__((visibility(\"hidden\"))) const unsigned char " << bytesSym
     << "[];\n"
     << "extern \"C\" __attribute__((visibility(\"hidden\"))) const uint64_t " << sizeSym
     << ";\n\n";

  os << "namespace {\n\n"
     << "constexpr const char *kLibraryName = " << stringLiteral(lib.prefix) << ";\n"
     << "/// The plan file's size when this source was generated.\n"
     << "constexpr uint64_t kPlanBytes = " << lib.planBytes << ";\n\n"
     << "/// Where each rank's plan file lies in the plan bytes.\n"
     << "struct RankPlanSpan {\n  uint64_t offset;\n  uint64_t size;\n};\n"
     << "constexpr RankPlanSpan kRankPlans[" << lib.ns << "::kWorldSize] = {\n";
  for (size_t rank = 0; rank < lib.ranks.size(); ++rank) {
    os << "    {" << lib.ranks[rank].offset << ", " << lib.ranks[rank].size << "}, // rank "
       << rank;
    if (rank == 0)
      os << ", with the global part (the .metadata a save commits)";
    os << "\n";
  }
  os << "};\n\n"
     << "int report(char *error, size_t errorSize, const fsdp::Error &failure) {\n"
     << "  if (error && errorSize) {\n"
     << "    size_t n = failure.message.size() < errorSize - 1 ? failure.message.size()\n"
     << "                                                      : errorSize - 1;\n"
     << "    std::memcpy(error, failure.message.data(), n);\n"
     << "    error[n] = '\\0';\n  }\n"
     << "  return fsdp::errorKindExitCode(failure.kind);\n}\n\n"
     << "} // namespace\n\n";

  // C definitions.
  os << "extern \"C\" {\n\n"
     << "const fsdp_buffer_info " << lib.sym("buffers") << "[" << lib.macro("BUFFER_COUNT")
     << "] = {\n";
  for (const BufferRow &row : lib.buffers)
    os << "    {" << row.group << ", FSDP_" << roleSpelling(row.role).upper << ", "
       << static_cast<int>(row.dtype) << " /* " << dtypeBrief(row.dtype) << " */, "
       << row.elements << ", " << (row.aliasesMainWeight ? 1 : 0) << "}, /* "
       << row.enumName(lib.prefixUpper) << " */\n";
  os << "};\n\n"
     << "int64_t " << lib.sym("buffer_elements")
     << "(int64_t rank, int32_t group, int32_t role) {\n"
     << "  return " << lib.ns << "::bufferElements(rank, group, static_cast<" << lib.ns
     << "::Role>(role));\n}\n\n"
     << "size_t " << lib.sym("element_size") << "(int32_t dtype) {\n"
     << "  if (dtype < 0 || dtype > static_cast<int32_t>(fsdp::dcp::DType::UInt64))\n"
     << "    return 0;\n"
     << "  return fsdp::dcp::dtypeInfo(static_cast<fsdp::dcp::DType>(dtype)).elementSize;\n"
     << "}\n\n"
     << "const void *" << lib.sym("rank_plan") << "(int64_t rank, size_t *size) {\n"
     << "  std::string_view plan = " << lib.ns << "::rankPlan(rank);\n"
     << "  if (size)\n    *size = plan.size();\n"
     << "  return plan.empty() ? nullptr : plan.data();\n}\n\n"
     << "int " << lib.sym("open")
     << "(int allocate, fsdp_checkpointer **out, char *error, size_t error_size) {\n"
     << "  if (!out)\n"
     << "    return report(error, error_size,\n"
     << "                  fsdp::makeError(\"no place for the checkpointer\", "
        "fsdp::ErrorKind::InvalidArgument));\n"
     << "  *out = nullptr;\n"
     << "  fsdp::Result<" << lib.ns << "::Checkpoint> opened = " << lib.ns
     << "::Checkpoint::open(allocate != 0);\n"
     << "  if (!opened)\n    return report(error, error_size, opened.failure());\n"
     << "  *out = opened->release();\n"
     << "  return *out ? FSDP_OK : report(error, error_size, fsdp::makeError(\"out of "
        "memory\"));\n}\n\n"
     << "} // extern \"C\"\n\n";

  // C++ definitions.
  os << "namespace " << lib.ns << " {\n\n"
     << "int64_t bufferElements(int64_t rank, int32_t group, Role role) {\n"
     << "  if (rank < 0 || rank >= kWorldSize)\n    return -1;\n"
     << "  for (const BufferInfo &buffer : kBuffers)\n"
     << "    if (buffer.group == group && buffer.role == role)\n"
     << "      return buffer.elements;\n"
     << "  return 0;\n}\n\n"
     << "std::string_view rankPlan(int64_t rank) {\n"
     << "  if (rank < 0 || rank >= kWorldSize)\n    return {};\n"
     << "  const RankPlanSpan &span = kRankPlans[rank];\n"
     << "  return {reinterpret_cast<const char *>(" << bytesSym
     << ") + span.offset, span.size};\n}\n\n"
     << "fsdp::Result<Checkpoint> Checkpoint::open(bool allocate) {\n"
     << "  fsdp::Result<std::unique_ptr<fsdp::runtime::Communicator>> comm =\n"
     << "      fsdp::runtime::createDefaultCommunicator(nullptr, nullptr);\n"
     << "  if (!comm)\n    return comm.failure();\n"
     << "  return open(comm.take(), allocate);\n}\n\n"
     << "fsdp::Result<Checkpoint> Checkpoint::open(std::unique_ptr<fsdp::runtime::Communicator> "
        "comm,\n"
     << "                                          bool allocate) {\n"
     << "  if (!comm)\n"
     << "    return fsdp::makeError(\"no communicator\", fsdp::ErrorKind::InvalidArgument);\n"
     << "  if (comm->size() != kWorldSize)\n"
     << "    return fsdp::makeError(std::string(kLibraryName) + \": generated for \" +\n"
     << "                               std::to_string(kWorldSize) + \" ranks but \" +\n"
     << "                               std::to_string(comm->size()) +\n"
     << "                               \" are running (start one process per rank with "
        "mpirun -np \" +\n"
     << "                               std::to_string(kWorldSize) + \")\",\n"
     << "                           fsdp::ErrorKind::InvalidArgument);\n"
     << "  if (" << sizeSym << " != kPlanBytes)\n"
     << "    return fsdp::makeError(std::string(kLibraryName) + \": the embedded plan has \" +\n"
     << "                               std::to_string(" << sizeSym << ") +\n"
     << "                               \" bytes, not the \" + std::to_string(kPlanBytes) +\n"
     << "                               \" this source was generated with: generate both "
        "again\",\n"
     << "                           fsdp::ErrorKind::Corrupt);\n"
     << "  int64_t rank = comm->rank();\n"
     << "  std::string_view bytes = rankPlan(rank);\n"
     << "  fsdp::Result<fsdp::plan::PlanFile> file = fsdp::plan::PlanFile::fromBytes(\n"
     << "      std::string(bytes), std::string(kLibraryName) + \": the embedded plan of rank \" "
        "+\n"
     << "                              std::to_string(rank));\n"
     << "  if (!file)\n"
     << "    return fsdp::classify(file, file.error(), fsdp::ErrorKind::Corrupt);\n"
     << "  if (file->planId() != kPlanId || file->worldSize() != kWorldSize)\n"
     << "    return fsdp::makeError(file->name() + \": not this library's plan\",\n"
     << "                           fsdp::ErrorKind::Corrupt);\n"
     << "  fsdp::Result<std::unique_ptr<fsdp::runtime::Checkpointer>> runtime =\n"
     << "      fsdp::runtime::Checkpointer::open(file.take(), std::move(comm));\n"
     << "  if (!runtime)\n    return runtime.failure();\n"
     << "  if (allocate)\n"
     << "    if (fsdp::Status status = (*runtime)->allocate(); !status)\n"
     << "      return status.failure();\n"
     << "  return Checkpoint(runtime.take());\n}\n\n"
     << "void *Checkpoint::data(int32_t group, Role role) {\n"
     << "  fsdp::Result<fsdp::runtime::RankBuffers *> buffers = runtime_->buffers();\n"
     << "  if (!buffers)\n    return nullptr;\n"
     << "  fsdp::Result<fsdp::runtime::BufferView> view =\n"
     << "      (*buffers)->get(group, static_cast<fsdp::plan::BufferRole>(role));\n"
     << "  return view ? view->data : nullptr;\n}\n\n"
     << "fsdp::Status Checkpoint::bind(int32_t group, Role role, void *memory) {\n"
     << "  return runtime_->bind(group, static_cast<fsdp::plan::BufferRole>(role), memory);\n"
     << "}\n\n"
     << "fsdp::Result<fsdp::runtime::TransferStats> Checkpoint::save(const std::string &dir,\n"
     << "                                                            "
        "fsdp::runtime::SaveOptions options) {\n"
     << "  return runtime_->save(dir, std::move(options));\n}\n\n"
     << "fsdp::Result<fsdp::runtime::LoadResult> Checkpoint::load(const std::string &dir,\n"
     << "                                                         "
        "fsdp::runtime::LoadOptions options) {\n"
     << "  return runtime_->load(dir, std::move(options));\n}\n\n"
     << "fsdp::Status Checkpoint::fill(uint32_t seed) { return runtime_->fill(seed); }\n\n"
     << "fsdp::Status Checkpoint::check(uint32_t seed) { return runtime_->check(seed); }\n\n"
     << "fsdp_checkpointer *Checkpoint::release() {\n"
     << "  return fsdp::runtime::toCHandle(std::move(runtime_));\n}\n\n"
     << "} // namespace " << lib.ns << "\n";
}

//===----------------------------------------------------------------------===//
// The translation
//===----------------------------------------------------------------------===//

/// fsdp-translate's `-o` (mlir-translate's own option; it is a
/// cl::opt<std::string>): the plan file goes beside the output.
std::string translateOutputPath() {
  auto &options = llvm::cl::getRegisteredOptions();
  auto it = options.find("o");
  if (it == options.end())
    return "-";
  return static_cast<llvm::cl::opt<std::string> *>(it->second)->getValue();
}

std::string sourceOf(Location loc) {
  if (auto file = dyn_cast<FileLineColLoc>(loc))
    return llvm::sys::path::filename(file.getFilename().getValue()).str();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    for (Location inner : fused.getLocations())
      if (std::string name = sourceOf(inner); !name.empty())
        return name;
  if (auto name = dyn_cast<NameLoc>(loc))
    return sourceOf(name.getChildLoc());
  return "";
}

struct CppOptions {
  std::string header, ns, prefix, planFile;
};

LogicalResult translateToCpp(Operation *op, raw_ostream &os, const CppOptions &options) {
  ModelOp model = findModel(op);
  if (!model)
    return failure();
  Location loc = model.getLoc();
  // Option values are refused before anything is written, each naming the
  // option and the value.
  if (std::string problem = prefixProblem(options.prefix); !problem.empty())
    return emitError(loc) << "--cpp-symbol-prefix must " << problem << ", got '"
                          << printable(options.prefix) << "'";
  std::string ns = options.ns.empty() ? options.prefix : options.ns;
  if (std::string problem = namespaceProblem(ns, options.prefix); !problem.empty())
    return emitError(loc) << "--cpp-namespace"
                          << (options.ns.empty() ? " (by default the --cpp-symbol-prefix)" : "")
                          << " must " << problem << ", got '" << printable(ns) << "'";
  if (!options.header.empty())
    if (std::string problem = includeNameProblem(llvm::sys::path::filename(options.header));
        !problem.empty())
      return emitError(loc) << "--emit-cpp-header: the source includes the header by its file "
                               "name, which must "
                            << problem << ", got '" << printable(options.header) << "'";
  if (failed(getLoweredGroups(model, "--emit-cpp")))
    return failure();
  FailureOr<plan::ModelLayout> layout = buildModelLayout(model);
  if (failed(layout))
    return failure();

  Library lib;
  lib.layout = &*layout;
  lib.prefix = options.prefix;
  lib.prefixUpper = upper(options.prefix);
  lib.ns = ns;
  lib.modelName = "@" + model.getSymName().str();
  lib.source = sourceOf(loc);
  if (lib.source.empty())
    lib.source = "an unnamed input";

  // Where the files go: the plan file beside the output unless told.
  std::string output = translateOutputPath();
  lib.outputName = output == "-" ? "<stdout>" : llvm::sys::path::filename(output).str();
  SmallString<256> planPath(options.planFile);
  if (planPath.empty()) {
    if (output == "-")
      return emitError(loc) << "--emit-cpp writes the plan bytes to a file beside the output: "
                               "give -o FILE or --cpp-plan-file=FILE";
    planPath = output;
    llvm::sys::path::replace_extension(planPath, ".plans.bin");
  }
  if (std::error_code error = llvm::sys::fs::make_absolute(planPath))
    return emitError(loc) << printable(planPath.str()) << ": " << error.message();
  lib.planPath = planPath.str().str();
  if (!options.header.empty())
    lib.headerName = llvm::sys::path::filename(options.header).str();

  for (size_t g = 0; g < layout->groups.size(); ++g)
    for (const plan::BufferSpec &buffer : layout->groups[g].buffers)
      lib.buffers.push_back({static_cast<int32_t>(g), buffer.role, buffer.dtype,
                             layout->groups[g].shardSize, buffer.aliasesMainWeight});

  // The plan bytes: one rank's plan file at a time, straight to the file.
  std::string errorMessage;
  auto planFile = mlir::openOutputFile(lib.planPath, &errorMessage);
  if (!planFile)
    return emitError(loc) << printable(errorMessage);
  llvm::raw_fd_ostream &planOut = planFile->os();
  Result<uint64_t> written = plan::forEachSplitPlanFile(
      *layout, {}, [&](int64_t rank, const std::string &bytes) -> Status {
        if (rank == 0) {
          // Every rank's file carries the plan's identity; rank 0's is read
          // once for it (and to check that the bytes are a plan file).
          Result<plan::PlanFile> file = plan::PlanFile::fromBytes(bytes);
          if (!file)
            return file.failure();
          lib.planId = file->planId();
          lib.planVersion = file->version();
          // The buffers every rank holds are each group's shard: check the
          // tables above against what the planner laid out.
          Result<plan::RankPlan> plan = file->rank(0);
          if (!plan)
            return plan.failure();
          bool same = plan->buffers.size() == lib.buffers.size();
          for (size_t i = 0; same && i < lib.buffers.size(); ++i)
            same = plan->buffers[i].group == lib.buffers[i].group &&
                   plan->buffers[i].role == lib.buffers[i].role &&
                   plan->buffers[i].dtype == lib.buffers[i].dtype &&
                   plan->buffers[i].elements == lib.buffers[i].elements &&
                   plan->buffers[i].aliasesMainWeight == lib.buffers[i].aliasesMainWeight;
          if (!same)
            return makeError("rank 0's plan holds other buffers than the layout's groups");
        }
        lib.ranks.push_back({lib.planBytes, bytes.size()});
        planOut.write(bytes.data(), bytes.size());
        lib.planBytes += bytes.size();
        for (; lib.planBytes % 8; ++lib.planBytes)
          planOut << '\0';
        if (planOut.has_error())
          return makeError(lib.planPath + ": write failed: " + planOut.error().message());
        return Status::success();
      });
  if (!written)
    return emitError(loc) << "cannot plan: " << printable(written.error());
  planFile->keep();

  if (!options.header.empty()) {
    auto header = mlir::openOutputFile(options.header, &errorMessage);
    if (!header)
      return emitError(loc) << printable(errorMessage);
    writeHeader(header->os(), lib, lib.headerName);
    header->keep();
  }
  writeSource(os, lib);
  return success();
}

} // namespace

void fsdp::registerToCppTranslation() {
  static llvm::cl::opt<std::string> header(
      "emit-cpp-header",
      llvm::cl::desc("With --emit-cpp: also write the declarations (C and C++) to this "
                     "header, which the source includes by its file name"),
      llvm::cl::init(""));
  static llvm::cl::opt<std::string> ns(
      "cpp-namespace",
      llvm::cl::desc("With --emit-cpp: the C++ namespace of the API (default: the symbol "
                     "prefix)"),
      llvm::cl::init(""));
  static llvm::cl::opt<std::string> prefix(
      "cpp-symbol-prefix",
      llvm::cl::desc("With --emit-cpp: the prefix of every C symbol and macro (<P>_open, "
                     "<P>_buffers, <P>_WORLD_SIZE)"),
      llvm::cl::init("fsdp_model"));
  static llvm::cl::opt<std::string> planFile(
      "cpp-plan-file",
      llvm::cl::desc("With --emit-cpp: where the plan bytes go (default: the output with "
                     "the extension .plans.bin); the source embeds them from its absolute "
                     "path"),
      llvm::cl::init(""));
  static TranslateFromMLIRRegistration registration(
      "emit-cpp",
      "emit a C++ checkpoint library of a lowered model: its plans embedded, a typed API "
      "and the C entry point <prefix>_open",
      [](Operation *op, raw_ostream &os) {
        return translateToCpp(op, os, {header, ns, prefix, planFile});
      },
      [](DialectRegistry &registry) { registry.insert<FSDPDialect>(); });
}
