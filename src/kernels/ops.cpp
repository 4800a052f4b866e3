// Placeholder: dispatch lands with the CPU kernels.
namespace moetrain {}
