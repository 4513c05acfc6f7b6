#pragma once
// TensorBoard event records, serialized: the protobuf wire encoding of the
// three messages Ember writes (Event, Summary.Value, HistogramProto) and the
// TFRecord framing of an event file. Written by hand, so Ember needs neither
// protobuf nor protoc: the messages are small and fixed, and their field
// numbers and wire types (TensorBoard's event.proto, summary.proto and
// histogram.proto, listed in tensorboard_record.cpp) are all the format has.
//
// A record of an event file (TFRecord framing, little endian):
//   uint64 length | uint32 masked_crc32c(length bytes) | payload | uint32 masked_crc32c(payload)

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ember::monitor::detail {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes.
uint32_t crc32c(const void* data, size_t size);

/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32),
/// of crc32c(data, size).
uint32_t masked_crc32c(const void* data, size_t size);

/// Appends one framed record holding `payload` to `out`.
void append_record(std::string& out, const std::string& payload);

/// A histogram in TensorBoard's HistogramProto form.
struct Histogram {
  double min = 0;
  double max = 0;
  double num = 0;  ///< number of values counted
  double sum = 0;
  double sum_squares = 0;
  std::vector<double> bucket_limit;  ///< right edge of each bucket, increasing
  std::vector<double> bucket;        ///< count of each bucket; same length
};

/// Serialized Event{wall_time, file_version}: the first record of every file.
std::string file_version_event(const std::string& version, double wall_time);

/// Serialized Event{wall_time, step, Summary{Value{tag, simple_value}}}.
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);

/// Serialized Event{wall_time, step, Summary{Value{tag, histo}}}.
std::string histogram_event(const std::string& tag, const Histogram& histogram, int64_t step,
                            double wall_time);

}  // namespace ember::monitor::detail
