// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors):
//   8 bytes   little-endian u64 N, the header's length
//   N bytes   JSON: {"name": {"dtype": "F32"|"F64"|"I64"|"BOOL", "shape": [...],
//             "data_offsets": [begin, end]}, ..., "__metadata__": {"k": "v"}} padded with spaces
//   the rest  raw little-endian tensor data; offsets are relative to its start, and the tensors
//             cover it exactly (no overlap, no gap)
// Names are the module's dotted state_dict names, so files map one to one onto PyTorch's.
#pragma once

#include <map>
#include <string>

#include "nn/module.h"

namespace ember::nn {

// Writes parameters and buffers to path through a temporary file renamed into place, so a crash
// mid-save leaves any old file intact and a reader sees the old file or the new one, never a
// part. The temporary is unique and created exclusively beside path (concurrent saves and a
// symlink planted at a predictable name are safe), synced to disk and removed on any failure.
void save(const Module& module, const std::string& path);
// Reads path into the module's tensors. The whole header is validated (offsets, dtypes, shapes)
// and the loaded tensors' bytes read before any tensor changes: on error the module is
// unchanged. strict: a name missing from the file or unexpected in it is an error (all are
// listed at once); else loads the overlap. Any file, however corrupt or hostile, loads or throws
// ember::Error with a short message, in time and memory proportional to its size.
void load(Module& module, const std::string& path, bool strict = true);

// The tensors of a safetensors file by name (new storage), and its __metadata__.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsFile read_safetensors(const std::string& path);
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace ember::nn
