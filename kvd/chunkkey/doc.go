// Package chunkkey derives the kvd keys and namespaces under which the
// reference's vLLM kvd connector (infera.engine.vllm.kvd_connector, the
// connector `infera worker --engine vllm --kvd-socket` wires in; facts in
// shared/protocols/kvd.md §8.7) stores and asks for KV chunks, so that a
// Go component can name exactly the entries a vLLM engine will look up.
//
// What the connector does, and this package reproduces:
//
//   - A prompt's blocks are grouped into chunks of N consecutive blocks,
//     N = max(1, chunk_tokens / block_size), counted from the prompt's
//     first block (chunk c holds blocks [c·N, (c+1)·N)). chunk_tokens is
//     INFERA_KVD_CHUNK_TOKENS on the engine when set; unset, "auto" or 0,
//     the connector sizes it from the model's KV bytes per block
//     (INFERA_KVD_CHUNK_TARGET_MIB, 128 MiB by default), which only the
//     engine knows. A partial last chunk is neither saved nor probed.
//   - The chunk key is the first 8 bytes of sha256 over the chunk's block
//     hashes as the engine's request holds them, concatenated: the full
//     digests (32 bytes each with vLLM's sha256 hashing) when they are
//     bytes, 8 bytes little-endian when they are integers (AppendIntHash).
//   - Each KV-cache group has its own entry: the chunk key's first 7 bytes
//     and the group id's low byte (Group). A single-group model uses 0.
//   - The namespace is (model, compat_key): model is the engine's model
//     (vLLM's model_config.model, the path or hub id it loaded, not the
//     served name); compat_key is CompatKey of the process's TP and PP
//     ranks, TP collapsed to rank 0 for an MLA model with TP > 1, and a
//     weight fingerprint when the model is a local directory. Every
//     TP×PP rank reads and writes its own namespace (CompatKeys lists
//     them).
//
// What vLLM's KV events carry is not enough to use this from the router:
// they name each block by the low 8 bytes of its digest
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, on by default and forced by the
// reference), and sha256 over the 8-byte truncations is another key.
//
// Everything here is a pure function, safe for concurrent use.
package chunkkey
