// `ingot launch`: the torchrun-style launcher (distributed/launch/). Parses the flags, runs the launcher loop
// and turns its outcome into the exit status documented in `ingot launch --help`.
#include <iostream>
#include <string>
#include <vector>

#include "distributed/launch/agent.h"
#include "distributed/launch/options.h"
#include "runtime/error.h"

namespace ingot {

int launch_main(const std::vector<std::string>& args) {
  using namespace ingot::distributed::launch;
  try {
    LaunchOptions opts = parse_launch_args(args);
    if (opts.help) {
      std::cout << kLaunchHelp;
      return kLaunchOk;
    }
    return run_launcher(opts, std::cerr);
  } catch (const LaunchUsageError& e) {
    std::cerr << "ingot launch: " << e.what() << "\nTry 'ingot launch --help'.\n";
    return kLaunchUsage;
  } catch (const std::exception& e) {
    std::cerr << "ingot launch: error: " << e.what() << "\n";
    return kLaunchFailed;
  }
}

}  // namespace ingot
