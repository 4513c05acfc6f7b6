#pragma once
// Declarations only (see README.md). The base of the header's inline
// GlooStore, which Ember never instantiates.
#include <chrono>
#include <string>
#include <vector>

namespace gloo {
namespace rendezvous {
class Store {
 public:
  virtual ~Store();
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) = 0;
};
}  // namespace rendezvous
}  // namespace gloo
