// Signal handling for a clean stop (see signals.h). The flag is the one process-wide mutable
// state here, as a signal handler can reach nothing else; it is a lock-free atomic, and the
// handler calls only async-signal-safe functions (write, _exit).
#include "train/signals.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "core/check.h"

namespace moetrain {

namespace {

std::atomic<int> g_stop_signal{0};
struct sigaction g_old_term, g_old_int;
std::atomic<bool> g_installed{false};

void on_signal(int sig) {
  int expected = 0;
  if (!g_stop_signal.compare_exchange_strong(expected, sig)) {
    static const char kMsg[] = "\nmoetrain: second signal, exiting without saving\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(128 + sig);
  }
  static const char kMsg[] = "\nmoetrain: stop requested, saving a checkpoint at the end of this step (signal again to abort)\n";
  (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
}

}  // namespace

StopSignal::StopSignal() {
  MT_CHECK(!g_installed.exchange(true), "[signals] a StopSignal is already installed");
  g_stop_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignal::~StopSignal() {
  sigaction(SIGTERM, &g_old_term, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  g_installed.store(false);
}

bool StopSignal::requested() const { return g_stop_signal.load() != 0; }
int StopSignal::signal_number() const { return g_stop_signal.load(); }

}  // namespace moetrain
