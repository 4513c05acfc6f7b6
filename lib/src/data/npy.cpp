// data::read_npy and write_npy.
#include "ember/data/npy.h"

#include <torch/torch.h>

#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/check.h"

namespace ember::data {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";

// NumPy's dtype strings (without the byte-order character) and their dtypes.
const std::pair<const char*, torch::ScalarType> kDtypes[] = {
    {"b1", torch::kBool},    {"u1", torch::kUInt8},   {"i1", torch::kInt8},
    {"i2", torch::kInt16},   {"i4", torch::kInt32},   {"i8", torch::kInt64},
    {"f2", torch::kFloat16}, {"f4", torch::kFloat32}, {"f8", torch::kFloat64}};

/// The text of `key`'s value in the header dict: "'|u1'", "False", "(28, 28)".
std::string value_of(const std::string& header, const std::string& key) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  size_t at = header.find(':', k);
  if (at == std::string::npos) return "";
  ++at;
  while (at < header.size() && header[at] == ' ') ++at;
  if (at >= header.size()) return "";
  const char open = header[at];
  const size_t end = open == '('    ? header.find(')', at)
                     : open == '\'' ? header.find('\'', at + 1)
                                    : header.find(',', at);
  if (end == std::string::npos) return "";
  return header.substr(at, end - at + (open == '(' || open == '\'' ? 1 : 0));
}

}  // namespace

torch::Tensor read_npy(std::string_view bytes, const std::string& where) {
  auto bad = [&](const std::string& what) {
    ember::detail::fail(ErrorKind::kData, "{}: not a usable .npy array: {}", where, what);
  };
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kNpyMagic, 6) != 0) bad("no \\x93NUMPY magic");
  const auto major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, at = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) bad("cut short in its header");
    header_len = 0;
    for (int i = 0; i < 4; ++i)
      header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    at = 12;
  } else {
    bad("format version " + std::to_string(major) + " (1, 2 and 3 are read)");
  }
  if (header_len > bytes.size() - at) bad("cut short in its header");
  const std::string header(bytes.substr(at, header_len));
  at += header_len;
  const std::string descr = value_of(header, "descr");
  if (descr.size() < 4 || descr.front() != '\'' || descr.back() != '\'') bad("no 'descr' in the header");
  const char order = descr[1];
  const std::string code = descr.substr(2, descr.size() - 3);
  std::optional<torch::ScalarType> dtype;
  for (const auto& [name, type] : kDtypes)
    if (code == name) dtype = type;
  if (!dtype) bad("dtype " + descr + " (bool, uint8, int8..int64, float16..float64 are read)");
  const size_t item = c10::elementSize(*dtype);
  if (order == '>' && item > 1) bad("big-endian dtype " + descr + "; save it little-endian");
  if (order != '<' && order != '|' && order != '=' && order != '>') bad("dtype " + descr);
  if (value_of(header, "fortran_order") != "False") bad("fortran_order is not False; save it in C order");
  const std::string shape_text = value_of(header, "shape");
  if (shape_text.size() < 2 || shape_text.front() != '(') bad("no 'shape' tuple in the header");
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (size_t i = 1; i + 1 < shape_text.size();) {
    while (i + 1 < shape_text.size() && (shape_text[i] == ' ' || shape_text[i] == ',')) ++i;
    if (i + 1 >= shape_text.size()) break;
    size_t j = i;
    while (j < shape_text.size() && shape_text[j] >= '0' && shape_text[j] <= '9') ++j;
    if (j == i || j - i > 12) bad("shape " + shape_text);
    const int64_t d = std::stoll(shape_text.substr(i, j - i));
    if (d > 0 && numel > std::numeric_limits<int64_t>::max() / d) bad("shape " + shape_text + " overflows");
    shape.push_back(d);
    numel *= d;
    i = j;
  }
  if (static_cast<size_t>(numel) > (bytes.size() - at) / std::max<size_t>(item, 1) ||
      static_cast<size_t>(numel) * item != bytes.size() - at)
    bad(fmt::format("shape {} of {} needs {} bytes of data, the file holds {}", shape_text, descr,
                    static_cast<double>(numel) * static_cast<double>(item), bytes.size() - at));
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(*dtype));
  if (numel > 0) std::memcpy(t.data_ptr(), bytes.data() + at, static_cast<size_t>(numel) * item);
  return t;
}

std::string write_npy(const torch::Tensor& tensor) {
  const char* code = nullptr;
  for (const auto& [name, type] : kDtypes)
    if (tensor.scalar_type() == type) code = name;
  EMBER_CHECK(code != nullptr, "[data::write_npy] dtype {} has no .npy form here",
              c10::toString(tensor.scalar_type()));
  const torch::Tensor t = tensor.cpu().contiguous();
  std::string shape = "(";
  for (int64_t d : t.sizes()) shape += std::to_string(d) + ", ";
  if (t.dim() > 1) shape.resize(shape.size() - 2);
  if (t.dim() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  const char order = c10::elementSize(t.scalar_type()) == 1 ? '|' : '<';
  std::string header =
      fmt::format("{{'descr': '{}{}', 'fortran_order': False, 'shape': {}, }}", order, code, shape);
  // Padded with spaces so that magic + length + header + '\n' is a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kNpyMagic, 6);
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>((header.size() >> 8) & 0xff);
  out += header;
  out.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  return out;
}

}  // namespace ember::data
