package kvd

// Memory is the arena's mapping, for registering it with a device runtime
// (hipHostRegister in the GPU build) so that engines' copies into and out
// of it are DMA from pinned memory. The bytes belong to the arena: only
// its slot protocol may read or write them.
func (a *Arena) Memory() []byte { return a.mem }
