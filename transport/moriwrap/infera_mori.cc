// libinfera_mori.so: the extern "C" wrapper over MoRI-IO that the `mori`
// build of package transport loads (its functions are declared in
// ../mori_c.h). Written against the mori::io API of ROCm/mori
// (include/mori/io/engine.hpp, common.hpp, backend.hpp). It is not built by
// `make test` (CI has no MoRI); on a node with MoRI installed:
//
//   c++ -std=c++17 -O2 -shared -fPIC -I../ -I$MORI_HOME/include \
//       -o libinfera_mori.so infera_mori.cc -L$MORI_HOME/lib -lmori_io
//
// The tests exercise the same C functions through testdata/mori_stub.c.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "mori/io/engine.hpp"
#include "mori_c.h"

namespace mio = mori::io;

struct infera_mori_engine {
	std::unique_ptr<mio::IOEngine> io;
	std::mutex mu;
	std::unordered_map<uint32_t, mio::MemoryDesc> mems;  // by MemoryDesc.id
	std::unordered_map<std::string, bool> peers;
};

namespace {

// A submitted transfer: the status MoRI completes.
struct xfer {
	mio::TransferStatus status;
};

mio::MemoryLocationType loc_of(int32_t device) {
	return device >= 0 ? mio::MemoryLocationType::GPU : mio::MemoryLocationType::CPU;
}

}  // namespace

extern "C" {

int infera_mori_create(const char *key, const char *host, uint16_t port, infera_mori_engine **out) {
	if (key == nullptr || *key == 0 || host == nullptr || out == nullptr) return INFERA_MORI_ERR_INVALID;
	try {
		auto e = std::make_unique<infera_mori_engine>();
		mio::IOEngineConfig cfg;
		cfg.host = host;
		cfg.port = port;
		e->io = std::make_unique<mio::IOEngine>(key, cfg);
		e->io->CreateBackend(mio::BackendType::RDMA, mio::RdmaBackendConfig());
		*out = e.release();
		return INFERA_MORI_OK;
	} catch (const std::exception &) {
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
}

void infera_mori_destroy(infera_mori_engine *e) { delete e; }

int infera_mori_add_peer(infera_mori_engine *e, const char *key, const char *host, uint16_t port) {
	if (e == nullptr || key == nullptr || host == nullptr) return INFERA_MORI_ERR_INVALID;
	try {
		mio::EngineDesc d;
		d.key = key;
		d.hostname = host;
		d.host = host;
		d.port = port;
		e->io->RegisterRemoteEngine(d);
		std::lock_guard<std::mutex> g(e->mu);
		e->peers[key] = true;
		return INFERA_MORI_OK;
	} catch (const std::exception &) {
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
}

int infera_mori_register(infera_mori_engine *e, void *addr, uint64_t size, int32_t device, uint32_t *id) {
	if (e == nullptr || addr == nullptr || size == 0 || id == nullptr) return INFERA_MORI_ERR_INVALID;
	try {
		mio::MemoryDesc m = e->io->RegisterMemory(addr, size, device, loc_of(device));
		std::lock_guard<std::mutex> g(e->mu);
		e->mems[m.id] = m;
		*id = m.id;
		return INFERA_MORI_OK;
	} catch (const std::exception &) {
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
}

int infera_mori_deregister(infera_mori_engine *e, uint32_t id) {
	if (e == nullptr) return INFERA_MORI_ERR_INVALID;
	mio::MemoryDesc m;
	{
		std::lock_guard<std::mutex> g(e->mu);
		auto it = e->mems.find(id);
		if (it == e->mems.end()) return INFERA_MORI_ERR_NOT_FOUND;
		m = it->second;
		e->mems.erase(it);
	}
	try {
		e->io->DeregisterMemory(m);
		return INFERA_MORI_OK;
	} catch (const std::exception &) {
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
}

int infera_mori_submit(infera_mori_engine *e, int is_read, uint32_t local_id, const infera_mori_mem *remote,
                       const uint64_t *local_offs, const uint64_t *remote_offs, const uint64_t *sizes, size_t n,
                       uint64_t *out) {
	if (e == nullptr || remote == nullptr || remote->engine_key == nullptr || n == 0 || out == nullptr)
		return INFERA_MORI_ERR_INVALID;
	mio::MemoryDesc local;
	{
		std::lock_guard<std::mutex> g(e->mu);
		auto it = e->mems.find(local_id);
		if (it == e->mems.end() || e->peers.count(remote->engine_key) == 0) return INFERA_MORI_ERR_NOT_FOUND;
		local = it->second;
	}
	mio::MemoryDesc rem;
	rem.engineKey = remote->engine_key;
	rem.id = remote->id;
	rem.deviceId = remote->device;
	rem.data = remote->addr;
	rem.size = remote->size;
	rem.loc = loc_of(remote->device);
	mio::SizeVec lo(local_offs, local_offs + n), ro(remote_offs, remote_offs + n), sz(sizes, sizes + n);
	for (size_t i = 0; i < n; i++) {
		if (sz[i] == 0) return INFERA_MORI_ERR_INVALID;
		if (sz[i] > local.size || lo[i] > local.size - sz[i]) return INFERA_MORI_ERR_RANGE;
		if (rem.size != 0 && (sz[i] > rem.size || ro[i] > rem.size - sz[i])) return INFERA_MORI_ERR_RANGE;
	}
	auto x = std::make_unique<xfer>();
	try {
		mio::MemDescVec locals{local}, remotes{rem};
		mio::BatchSizeVec los{lo}, ros{ro}, szs{sz};
		mio::TransferStatusPtrVec statuses{&x->status};
		mio::TransferUniqueIdVec ids{e->io->AllocateTransferUniqueId()};
		if (is_read) {
			e->io->BatchRead(locals, los, remotes, ros, szs, statuses, ids);
		} else {
			e->io->BatchWrite(locals, los, remotes, ros, szs, statuses, ids);
		}
	} catch (const std::exception &) {
		return INFERA_MORI_ERR_UNAVAILABLE;
	}
	*out = reinterpret_cast<uint64_t>(x.release());
	return INFERA_MORI_OK;
}

int infera_mori_poll(infera_mori_engine *e, uint64_t id, char *msg, size_t msg_len) {
	(void)e;
	auto *x = reinterpret_cast<xfer *>(id);
	if (x == nullptr) return INFERA_MORI_ERR_NOT_FOUND;
	if (x->status.Init() || x->status.InProgress()) return INFERA_MORI_IN_PROGRESS;
	if (x->status.Succeeded()) return INFERA_MORI_OK;
	if (msg != nullptr && msg_len > 0) std::snprintf(msg, msg_len, "%s", x->status.Message().c_str());
	return INFERA_MORI_ERR_TRANSFER;
}

void infera_mori_release(infera_mori_engine *e, uint64_t id) {
	(void)e;
	delete reinterpret_cast<xfer *>(id);
}

}  // extern "C"
