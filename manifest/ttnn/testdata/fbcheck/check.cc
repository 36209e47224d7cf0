// Verifies .tensorbin files with the flatbuffers C++ verifier generated
// from tensor.fbs (see run.sh) and prints a line per file.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include "tensor_generated.h"
int main(int argc, char** argv) {
  int bad = 0;
  for (int i = 1; i < argc; i++) {
    FILE* f = fopen(argv[i], "rb");
    if (!f) { printf("%s: cannot open\n", argv[i]); bad++; continue; }
    std::vector<uint8_t> d;
    uint8_t buf[65536]; size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) d.insert(d.end(), buf, buf + n);
    fclose(f);
    uint64_t hs; memcpy(&hs, d.data(), 8);
    flatbuffers::Verifier v(d.data() + 8, hs);
    bool ok = ttnn::flatbuffer::VerifyTensorBuffer(v);
    const auto* t = ttnn::flatbuffer::GetTensor(d.data() + 8);
    if (!ok) { printf("FAIL %s\n", argv[i]); bad++; continue; }
    auto* sh = t->tensor_spec()->shape();
    printf("OK %s shape=[", argv[i]);
    for (unsigned k = 0; k < sh->size(); k++) printf("%s%u", k ? "," : "", sh->Get(k));
    auto* s0 = t->shards()->Get(0)->buffer_as_InlineFileStorage();
    printf("] dtype=%d page=%d shards=%u off=%llu size=%llu data_start=%llu\n", (int)t->tensor_spec()->tensor_layout()->data_type(),
      (int)t->tensor_spec()->tensor_layout()->page_config_type(), t->shards()->size(), (unsigned long long)s0->offset(), (unsigned long long)s0->size(), (unsigned long long)(8+hs));
  }
  return bad ? 1 : 0;
}
