// Programmatic dependent launch (src/kernels/cuda/pdl.cuh) lets a kernel start while the one before
// it is still finishing, so a kernel launched that way that touched global memory before its
// pdl_wait() would race with its producer. These checks read the CUDA sources (they run without a
// GPU): every kernel's body starts with pdl_wait(), and no launch bypasses launch_pdl's settings
// with the <<<...>>> syntax.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

std::vector<fs::path> cuda_sources() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(fs::path(MT_SOURCE_DIR) / "src" / "kernels" / "cuda")) {
    const std::string ext = e.path().extension().string();
    if (ext == ".cu" || ext == ".cuh") out.push_back(e.path());
  }
  return out;
}

// The file with // comments blanked (block comments are not used in these sources).
std::string code_of(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream out;
  std::string line;
  while (std::getline(in, line)) {
    const size_t c = line.find("//");
    out << (c == std::string::npos ? line : line.substr(0, c)) << '\n';
  }
  return out.str();
}

int line_at(const std::string& s, size_t pos) {
  int n = 1;
  for (size_t i = 0; i < pos && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

TEST(PdlSources, EveryKernelWaitsFirst) {
  const std::vector<fs::path> files = cuda_sources();
  ASSERT_GT(files.size(), 10u) << "src/kernels/cuda not found under " << MT_SOURCE_DIR;
  int kernels = 0;
  for (const fs::path& f : files) {
    const std::string s = code_of(f);
    for (size_t at = s.find("__global__"); at != std::string::npos; at = s.find("__global__", at + 1)) {
      const size_t brace = s.find('{', at);
      ASSERT_NE(brace, std::string::npos) << f << ":" << line_at(s, at);
      size_t i = brace + 1;
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      EXPECT_EQ(s.compare(i, 11, "pdl_wait();"), 0)
          << f.filename().string() << ":" << line_at(s, at) << ": the kernel's first statement must be pdl_wait()";
      ++kernels;
    }
  }
  EXPECT_GT(kernels, 50);
}

TEST(PdlSources, NoTripleChevronLaunches) {
  for (const fs::path& f : cuda_sources()) {
    const std::string s = code_of(f);
    const size_t at = s.find("<<<");
    EXPECT_EQ(at, std::string::npos) << f.filename().string() << ":" << line_at(s, at)
                                     << ": launch with launch_pdl (pdl.cuh), not <<<...>>>";
  }
}

}  // namespace
