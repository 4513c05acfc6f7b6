#include "ember/train/safetensors.h"

#include <torch/torch.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_set>

#include "core/check.h"
#include "ember/core/file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ember's safetensors reader/writer copies tensor bytes as they are: it needs a little-endian host"
#endif

namespace ember::train {
namespace {

/// The Python/Rust reference refuses larger headers too (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeName {
  c10::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {c10::kDouble, "F64"}, {c10::kFloat, "F32"}, {c10::kHalf, "F16"},  {c10::kBFloat16, "BF16"},
    {c10::kLong, "I64"},   {c10::kInt, "I32"},   {c10::kShort, "I16"}, {c10::kChar, "I8"},
    {c10::kByte, "U8"},    {c10::kBool, "BOOL"},
};
constexpr const char* kDtypeList = "F64, F32, F16, BF16, I64, I32, I16, I8, U8 or BOOL";

const char* dtype_name(c10::ScalarType type) {
  for (const DtypeName& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  return nullptr;
}

std::optional<c10::ScalarType> dtype_of(const std::string& name) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  return std::nullopt;
}

void write_u64_le(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

[[noreturn]] void bad_entry(const std::string& path, const std::string& name, const std::string& what) {
  ember::detail::fail("[train::load_safetensors] {}: tensor '{}': {}", path, name, what);
}

}  // namespace

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  // CPU, contiguous copies first: their byte sizes fix the offsets.
  std::vector<torch::Tensor> cpu;
  cpu.reserve(tensors.size());
  std::unordered_set<std::string> names;
  for (const auto& [name, t] : tensors) {
    EMBER_CHECK(
        name != "__metadata__",
        "[train::save_safetensors] {}: \"__metadata__\" is reserved for the metadata; rename the tensor",
        path);
    EMBER_CHECK(names.insert(name).second,
                "[train::save_safetensors] {}: tensor name '{}' appears twice; names must be unique", path,
                name);
    EMBER_CHECK(t.defined(), "[train::save_safetensors] {}: tensor '{}' is undefined", path, name);
    EMBER_CHECK(
        t.layout() == torch::kStrided,
        "[train::save_safetensors] {}: tensor '{}' has layout {}; only dense (strided) tensors can be "
        "saved (call .to_dense() first)",
        path, name, c10::str(t.layout()));
    EMBER_CHECK(
        dtype_name(t.scalar_type()) != nullptr,
        "[train::save_safetensors] {}: tensor '{}' has dtype {}; safetensors here takes {} (convert it "
        "with .to())",
        path, name, c10::toString(t.scalar_type()), kDtypeList);
    cpu.push_back(t.detach().to(torch::kCPU).contiguous());
  }

  // Key order: "__metadata__", then the tensors as given (as the Python package
  // writes it); offsets in the same order, so the data part has no gaps.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const uint64_t bytes = cpu[i].nbytes();
    header[tensors[i].first] = {{"dtype", dtype_name(cpu[i].scalar_type())},
                                {"shape", cpu[i].sizes().vec()},
                                {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    ember::detail::fail(
        "[train::save_safetensors] {}: a tensor name or metadata string is not valid UTF-8 ({})", path,
        e.what());
  }
  json.append((8 - json.size() % 8) % 8, ' ');

  std::string file;
  file.reserve(8 + json.size() + offset);
  write_u64_le(file, json.size());
  file += json;
  for (const torch::Tensor& t : cpu) file.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  core::write_file_atomic(path, file);
}

void save_safetensors(const std::string& path, const torch::nn::Module& module,
                      const std::map<std::string, std::string>& metadata) {
  NamedTensors tensors;
  std::unordered_set<const c10::TensorImpl*> seen;
  const auto add = [&](const torch::OrderedDict<std::string, torch::Tensor>& dict) {
    for (const auto& item : dict) {
      const torch::Tensor& t = item.value();
      if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) tensors.emplace_back(item.key(), t);
    }
  };
  add(module.named_parameters(/*recurse=*/true));
  add(module.named_buffers(/*recurse=*/true));
  save_safetensors(path, tensors, metadata);
}

namespace {

struct Entry {  // a tensor's entry in the header
  std::string name;
  c10::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

// Opens `path` and reads its header: the JSON object, with its length in
// `header_size` and the file's in `file_size`.
nlohmann::json read_header(std::ifstream& in, const std::string& path, uint64_t& file_size,
                           uint64_t& header_size) {
  EMBER_CHECK(in.good(), "[train::load_safetensors] {}: cannot open: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  EMBER_CHECK(
      file_size >= 8,
      "[train::load_safetensors] {}: {} bytes, too short for the 8-byte header length (truncated, or not "
      "a safetensors file)",
      path, file_size);
  unsigned char size_bytes[8];
  in.read(reinterpret_cast<char*>(size_bytes), 8);
  header_size = read_u64_le(size_bytes);
  EMBER_CHECK(header_size > 0 && header_size <= kMaxHeaderBytes,
              "[train::load_safetensors] {}: header length {} is not in 1..{} (not a safetensors file?)",
              path, header_size, kMaxHeaderBytes);
  EMBER_CHECK(
      header_size <= file_size - 8,
      "[train::load_safetensors] {}: header length {} runs past the end of the {}-byte file (truncated?)",
      path, header_size, file_size);
  std::string text(header_size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_size));
  EMBER_CHECK(in.good(), "[train::load_safetensors] {}: cannot read the header: {}", path,
              std::strerror(errno));
  EMBER_CHECK(text.front() == '{',
              "[train::load_safetensors] {}: the header does not start with '{{' (not a safetensors file?)",
              path);

  // Keys at depth 1 are tensor names (and "__metadata__"); JSON parsers keep
  // the last of duplicate keys silently, so catch those here.
  std::set<std::string> keys;
  std::string duplicate;
  const auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second)
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, on_event);
  } catch (const nlohmann::json::exception& e) {
    ember::detail::fail("[train::load_safetensors] {}: the header is not valid JSON: {}", path, e.what());
  }
  EMBER_CHECK(header.is_object(), "[train::load_safetensors] {}: the header is JSON but not an object", path);
  EMBER_CHECK(duplicate.empty(), "[train::load_safetensors] {}: the header names '{}' twice", path,
              duplicate);

  return header;
}

// The entry of tensor `name`, checked: a supported dtype, a shape of
// non-negative sizes, data_offsets that span exactly its bytes.
Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info) {
  const std::string& tensor_name = name;
  const auto bad = [&](const std::string& what) { bad_entry(path, tensor_name, what); };
  if (!info.is_object()) bad("expected an object with dtype, shape and data_offsets");
  const auto dtype_it = info.find("dtype");
  if (dtype_it == info.end() || !dtype_it->is_string()) bad("missing dtype (a string like \"F32\")");
  const auto dtype = dtype_of(dtype_it->get<std::string>());
  if (!dtype)
    bad(fmt::format("dtype {} is not supported; supported: {}", dtype_it->get<std::string>(), kDtypeList));

  const auto shape_it = info.find("shape");
  if (shape_it == info.end() || !shape_it->is_array()) bad("missing shape (an array of sizes)");
  Entry entry{name, *dtype, {}, 0, 0};
  uint64_t bytes = c10::elementSize(*dtype);
  for (const auto& dim : *shape_it) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad(fmt::format("shape {} has an entry that is not a non-negative integer", shape_it->dump()));
    const uint64_t d = dim.get<uint64_t>();
    if (__builtin_mul_overflow(bytes, d, &bytes)) bad(fmt::format("shape {} overflows", shape_it->dump()));
    entry.shape.push_back(static_cast<int64_t>(d));
  }

  const auto offsets_it = info.find("data_offsets");
  if (offsets_it == info.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
    bad("missing data_offsets (an array [begin, end] of byte offsets)");
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  if (entry.end < entry.begin) bad(fmt::format("data_offsets {} end before they begin", offsets_it->dump()));
  if (entry.end - entry.begin != bytes)
    bad(fmt::format("data_offsets {} span {} bytes, but shape {} of {} takes {}", offsets_it->dump(),
                    entry.end - entry.begin, shape_it->dump(), dtype_it->get<std::string>(), bytes));
  return entry;
}

// The byte ranges must tile the data part: sorted by offset, each begins
// where the previous ends, the last ends at the end of the file.
void check_tiling(const std::string& path, std::vector<Entry>& entries, uint64_t data_size) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    EMBER_CHECK(
        e.end <= data_size,
        "[train::load_safetensors] {}: tensor '{}': data_offsets [{}, {}] run past the {}-byte data part "
        "(truncated file?)",
        path, e.name, e.begin, e.end, data_size);
    EMBER_CHECK(
        e.begin == expected,
        "[train::load_safetensors] {}: tensor '{}': data_offsets [{}, {}] {} the previous tensor, which "
        "ends at {} (tensors must be laid out back to back)",
        path, e.name, e.begin, e.end, e.begin < expected ? "overlap" : "leave a gap after", expected);
    expected = e.end;
  }
  EMBER_CHECK(
      expected == data_size,
      "[train::load_safetensors] {}: the tensors cover {} bytes but the data part has {} (trailing bytes "
      "or a missing entry)",
      path, expected, data_size);
}

// One tensor's bytes, read into a CPU tensor (BOOL bytes checked).
torch::Tensor read_tensor(std::ifstream& in, const std::string& path, const Entry& e, uint64_t header_size) {
  torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
  if (e.end == e.begin) return t;
  in.seekg(static_cast<std::streamoff>(8 + header_size + e.begin));
  in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
  EMBER_CHECK(in.good(), "[train::load_safetensors] {}: tensor '{}': cannot read its {} bytes: {}", path,
              e.name, e.end - e.begin, std::strerror(errno));
  if (e.dtype == c10::kBool) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    const uint64_t n = e.end - e.begin;
    EMBER_CHECK(std::all_of(p, p + n, [](uint8_t b) { return b <= 1; }),
                "[train::load_safetensors] {}: tensor '{}': BOOL bytes must be 0 or 1", path, e.name);
  }
  return t;
}

// The file's header, validated whole (entries, metadata, tiling): its
// entries in data order and the header's length.
std::vector<Entry> read_entries(std::ifstream& in, const std::string& path, uint64_t& header_size,
                                std::map<std::string, std::string>* metadata) {
  uint64_t file_size = 0;
  const nlohmann::json header = read_header(in, path, file_size, header_size);
  if (metadata != nullptr) metadata->clear();
  std::vector<Entry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      EMBER_CHECK(info.is_object(), "[train::load_safetensors] {}: \"__metadata__\" is not an object", path);
      for (const auto& [key, value] : info.items()) {
        EMBER_CHECK(value.is_string(),
                    "[train::load_safetensors] {}: metadata '{}' is {}, expected a string (the format allows "
                    "only string values)",
                    path, key, value.type_name());
        if (metadata != nullptr) (*metadata)[key] = value.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(path, name, info));
  }
  check_tiling(path, entries, file_size - 8 - header_size);
  return entries;
}

}  // namespace

NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  const std::vector<Entry> entries = read_entries(in, path, header_size, metadata);
  NamedTensors tensors;
  tensors.reserve(entries.size());
  for (const Entry& e : entries) tensors.emplace_back(e.name, read_tensor(in, path, e, header_size));
  return tensors;
}

std::vector<TensorInfo> read_safetensors_header(const std::string& path,
                                                std::map<std::string, std::string>* metadata) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  std::vector<TensorInfo> infos;
  for (Entry& e : read_entries(in, path, header_size, metadata))
    infos.push_back({std::move(e.name), e.dtype, std::move(e.shape)});
  return infos;
}

void read_safetensors(const std::string& path, const std::function<bool(const TensorInfo&)>& want,
                      const std::function<void(const std::string&, torch::Tensor)>& take) {
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  for (const Entry& e : read_entries(in, path, header_size, nullptr)) {
    if (!want({e.name, e.dtype, e.shape})) continue;
    take(e.name, read_tensor(in, path, e, header_size));
  }
}

}  // namespace ember::train
