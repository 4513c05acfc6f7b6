#pragma once
// Declarations only (see README.md): devices are held by shared_ptr.
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
