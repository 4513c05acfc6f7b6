// TensorBoard event records: the protobuf wire format of the messages Ember
// writes, encoded by hand, and the TFRecord framing with its masked CRC-32C.
//
// The messages, with TensorBoard's field numbers and types (its
// tensorboard/compat/proto/{event,summary,histogram}.proto, proto3; only the
// fields Ember sets; never renumber):
//
//   message Event          { double wall_time = 1; int64 step = 2;
//                            oneof what { string file_version = 3; Summary summary = 5; } }
//   message Summary        { repeated Value value = 1; }
//   message Summary.Value  { string tag = 1;
//                            oneof value { float simple_value = 2; HistogramProto histo = 5; } }
//   message HistogramProto { double min = 1; double max = 2; double num = 3; double sum = 4;
//                            double sum_squares = 5;
//                            repeated double bucket_limit = 6 [packed]; repeated double bucket = 7 [packed];
//                            }
//
// Encoded as protobuf's own serializer does, byte for byte: fields in number
// order; a proto3 scalar left out when it holds its default (a double or float
// whose bits are all zero, so -0.0 is written; step 0; an empty tag); a oneof
// member always written once set; repeated doubles packed, left out when empty.
#include "monitor/tensorboard_record.h"

#include <array>
#include <cstring>

namespace ember::monitor::detail {
namespace {

// Wire types.
constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_key(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (field << 3) | wire_type);
}

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof(b));
  return b;
}

void put_double(std::string& out, uint32_t field, double v) {  // proto3: left out when the bits are zero
  if (bits_of(v) == 0) return;
  put_key(out, field, kFixed64);
  put_le(out, bits_of(v), 8);
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_packed(std::string& out, uint32_t field, const std::vector<double>& values) {
  if (values.empty()) return;
  put_key(out, field, kLengthDelimited);
  put_varint(out, values.size() * 8);
  for (double v : values) put_le(out, bits_of(v), 8);
}

// Event{wall_time, step, summary{value}} around one serialized Summary.Value.
std::string summary_event(const std::string& value, int64_t step, double wall_time) {
  std::string summary;
  put_bytes(summary, 1, value);  // Summary.value
  std::string event;
  put_double(event, 1, wall_time);
  if (step != 0) {
    put_key(event, 2, kVarint);
    put_varint(event, static_cast<uint64_t>(step));  // int64: two's complement, 10 bytes if negative
  }
  put_bytes(event, 5, summary);
  return event;
}

std::string value_with_tag(const std::string& tag) {
  std::string value;
  if (!tag.empty()) put_bytes(value, 1, tag);
  return value;
}

// The byte-at-a-time table of the reflected polynomial.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& table = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = (crc >> 8) ^ table[(crc ^ p[i]) & 0xffu];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void append_record(std::string& out, const std::string& payload) {
  std::string length;
  put_le(length, payload.size(), 8);
  out += length;
  put_le(out, masked_crc32c(length.data(), length.size()), 4);
  out += payload;
  put_le(out, masked_crc32c(payload.data(), payload.size()), 4);
}

std::string file_version_event(const std::string& version, double wall_time) {
  std::string event;
  put_double(event, 1, wall_time);
  put_bytes(event, 3, version);
  return event;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v = value_with_tag(tag);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  put_key(v, 2, kFixed32);  // simple_value: a oneof member, written even when 0
  put_le(v, bits, 4);
  return summary_event(v, step, wall_time);
}

std::string histogram_event(const std::string& tag, const Histogram& h, int64_t step, double wall_time) {
  std::string histo;
  put_double(histo, 1, h.min);
  put_double(histo, 2, h.max);
  put_double(histo, 3, h.num);
  put_double(histo, 4, h.sum);
  put_double(histo, 5, h.sum_squares);
  put_packed(histo, 6, h.bucket_limit);
  put_packed(histo, 7, h.bucket);
  std::string v = value_with_tag(tag);
  put_bytes(v, 5, histo);  // histo: a oneof member, written even when empty
  return summary_event(v, step, wall_time);
}

}  // namespace ember::monitor::detail
