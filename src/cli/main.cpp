// moetrain entry point: parses the subcommand and hands off to src/cli/<command>.cpp.
#include <cstdio>
int main(int argc, char** argv) { std::puts("moetrain"); return 0; }
