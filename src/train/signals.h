// Graceful stop on SIGTERM/SIGINT: the first signal only sets a flag that the trainer polls at
// step boundaries (it then saves a checkpoint and exits cleanly); a second signal exits at once
// with status 128 + signal. The handlers are installed for the lifetime of a StopSignal.
#pragma once

namespace moetrain {

class StopSignal {
 public:
  StopSignal();   // installs handlers for SIGTERM and SIGINT, clears the flag
  ~StopSignal();  // restores the previous handlers
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  bool requested() const;
  int signal_number() const;  // the first signal received, 0 if none
};

}  // namespace moetrain
