// The system-compiler driver: toolchain identity, and failures that must read as clear errors.
#include <gtest/gtest.h>

#include "compile/codegen/cpu/jit_cc.h"
#include "runtime/error.h"
#include "runtime/file_util.h"

namespace ingot::codegen::cpu {
namespace {

std::string error_of(const Toolchain& tc, const std::vector<CompileJob>& jobs) {
  try {
    run_compilers(tc, jobs, 2);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(JitCc, TheHostToolchainNamesCompilerFlagsAndCpu) {
  const Toolchain& tc = Toolchain::host();
  EXPECT_FALSE(tc.compiler.empty());
  EXPECT_NE(tc.identity.find("-march=native"), std::string::npos) << tc.identity;
  EXPECT_NE(tc.identity.find("-fopenmp"), std::string::npos) << tc.identity;
  EXPECT_EQ(tc.identity.find("-ffast-math"), std::string::npos) << tc.identity;
  EXPECT_NE(tc.identity.find('\n'), std::string::npos) << "the host CPU is part of the identity";
}

TEST(JitCc, AMissingCompilerIsAClearError) {
  TempDir dir("ingot-jit-");
  write_file_atomic(dir.file("a.cpp"), [](std::FILE* f) { write_bytes(f, "int x;\n", 7); });
  Toolchain tc = Toolchain::host();
  tc.compiler = "/nonexistent/ingot-c++";
  const std::string err = error_of(tc, {{dir.file("a.cpp"), dir.file("a.so"), dir.file("a.log")}});
  EXPECT_NE(err.find("cannot start the C++ compiler '/nonexistent/ingot-c++'"), std::string::npos) << err;
  EXPECT_NE(err.find("set INGOT_CXX"), std::string::npos) << err;
}

TEST(JitCc, ACompileErrorQuotesTheDiagnosticsAndNamesTheSource) {
  TempDir dir("ingot-jit-");
  const std::string good = "extern \"C\" int ok() { return 1; }\n", bad = "extern \"C\" int broken( { return 1; }\n";
  write_file_atomic(dir.file("good.cpp"), [&](std::FILE* f) { write_bytes(f, good.data(), good.size()); });
  write_file_atomic(dir.file("bad.cpp"), [&](std::FILE* f) { write_bytes(f, bad.data(), bad.size()); });
  const std::string err = error_of(Toolchain::host(), {{dir.file("good.cpp"), dir.file("good.so"), dir.file("good.log")},
                                                       {dir.file("bad.cpp"), dir.file("bad.so"), dir.file("bad.log")}});
  EXPECT_NE(err.find("the C++ compiler failed on generated source '" + dir.file("bad.cpp") + "' (exit code"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("error"), std::string::npos) << err;
  EXPECT_NE(err.find("bad.cpp:1"), std::string::npos) << "the diagnostic itself is quoted\n" << err;
}

}  // namespace
}  // namespace ingot::codegen::cpu
