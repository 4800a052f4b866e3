// EnergyMeter: a GPU's cumulative energy counter and power limit, read through NVML, which is loaded
// at run time (libnvidia-ml.so.1 comes with the driver, not the toolkit), so the build needs no NVML
// and a machine without it only loses the energy columns. The counter is the board's total energy
// since the driver loaded, in millijoules; the difference of two reads is the energy between them.
#pragma once
#include <memory>
#include <optional>
#include <string>

namespace moetrain {

// The PCI bus id of CUDA device `index` in NVML's form ("domain:bus:device.0"); empty without CUDA.
// NVML numbers devices its own way (CUDA_VISIBLE_DEVICES does not apply), so the bus id names the GPU.
std::string cuda_pci_bus_id(int index);

class EnergyMeter {
 public:
  explicit EnergyMeter(const std::string& pci_bus_id);  // empty: unavailable
  ~EnergyMeter();
  EnergyMeter(const EnergyMeter&) = delete;
  EnergyMeter& operator=(const EnergyMeter&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }
  std::optional<double> joules() const;         // the counter, J
  std::optional<double> power_limit_w() const;  // the enforced power limit, W

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  void* device_ = nullptr;  // nvmlDevice_t
  std::string why_;
};

}  // namespace moetrain
