// EnergyMeter over NVML entry points found with dlsym. The declarations below are NVML's C ABI
// (nvml.h, stable since NVML 5): every call returns an int status (0 = success) and devices are
// opaque pointers.
#include "core/energy_meter.h"

#include <dlfcn.h>

#include <cstdio>

#ifdef MT_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace moetrain {

std::string cuda_pci_bus_id(int index) {
#ifdef MT_WITH_CUDA
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  char bus[32];
  std::snprintf(bus, sizeof bus, "%08x:%02x:%02x.0", static_cast<unsigned>(p.pciDomainID),
                static_cast<unsigned>(p.pciBusID), static_cast<unsigned>(p.pciDeviceID));
  return bus;
#else
  (void)index;
  return {};
#endif
}

struct EnergyMeter::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_bus_id)(const char*, void**) = nullptr;
  int (*total_energy)(void*, unsigned long long*) = nullptr;  // mJ
  int (*power_limit)(void*, unsigned int*) = nullptr;         // mW
  bool initialized = false;
};

EnergyMeter::EnergyMeter(const std::string& pci_bus_id) : api_(std::make_unique<Api>()) {
  if (pci_bus_id.empty()) {
    why_ = "no GPU";
    return;
  }
  api_->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!api_->lib) {
    why_ = "libnvidia-ml.so.1 not found";
    return;
  }
  auto sym = [&](const char* name) { return dlsym(api_->lib, name); };
  api_->init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  api_->shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  api_->by_bus_id = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  api_->total_energy = reinterpret_cast<int (*)(void*, unsigned long long*)>(sym("nvmlDeviceGetTotalEnergyConsumption"));
  api_->power_limit = reinterpret_cast<int (*)(void*, unsigned int*)>(sym("nvmlDeviceGetEnforcedPowerLimit"));
  if (!api_->init || !api_->shutdown || !api_->by_bus_id || !api_->total_energy || !api_->power_limit) {
    why_ = "libnvidia-ml.so.1 lacks an entry point";
    return;
  }
  if (const int rc = api_->init(); rc != 0) {
    why_ = "nvmlInit_v2 returned " + std::to_string(rc);
    return;
  }
  api_->initialized = true;
  void* dev = nullptr;
  if (const int rc = api_->by_bus_id(pci_bus_id.c_str(), &dev); rc != 0 || !dev) {
    why_ = "NVML has no device at PCI bus id " + pci_bus_id + " (status " + std::to_string(rc) + ")";
    return;
  }
  unsigned long long mj = 0;
  if (const int rc = api_->total_energy(dev, &mj); rc != 0) {
    why_ = "this GPU has no energy counter (status " + std::to_string(rc) + ")";
    return;
  }
  device_ = dev;
}

EnergyMeter::~EnergyMeter() {
  if (api_->initialized) api_->shutdown();
  if (api_->lib) dlclose(api_->lib);
}

std::optional<double> EnergyMeter::joules() const {
  unsigned long long mj = 0;
  if (!device_ || api_->total_energy(device_, &mj) != 0) return std::nullopt;
  return static_cast<double>(mj) * 1e-3;
}

std::optional<double> EnergyMeter::power_limit_w() const {
  unsigned int mw = 0;
  if (!device_ || api_->power_limit(device_, &mw) != 0) return std::nullopt;
  return static_cast<double>(mw) * 1e-3;
}

}  // namespace moetrain
