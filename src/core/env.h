// Every environment variable moetrain reads, declared in one place with its default.
//   MT_LOG_LEVEL       debug|info|warn|error|off   (info)
//   MT_LOG_ALL_RANKS   1 makes every rank print    (0)
//   MT_SYNC_DEBUG      1 synchronizes the device after every op so faults point at their op (0)
//   MT_PROFILE         1 makes `moetrain train` time every op and print the totals per step (0)
//   MT_NUM_THREADS     CPU worker threads for kernels and data (0 = hardware concurrency)
//   MT_TEST_SAVE_PAUSE_MS  tests only: a checkpoint save sleeps this long before its rename (0)
//   MT_ATTN_ARCH       sm80 forces the mma.sync flash-attention kernels on Hopper too (read once; unset)
//   MT_ATTN_NONDETERMINISTIC  1 lets the Hopper flash-attention backward add dQ partials in arrival
//                      order (faster, not bitwise reproducible; read once) (0)
#pragma once
#include <string>

namespace moetrain {

std::string env_string(const char* name, const std::string& fallback);
long env_int(const char* name, long fallback);

bool env_log_all_ranks();
bool env_sync_debug();
int env_num_threads();

}  // namespace moetrain
