package tablespace

import "unsafe"

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// getBuf returns an aligned slot-sized buffer from the pool.
func (t *Tablespace) getBuf() *[]byte {
	if p, ok := t.bufs.Get().(*[]byte); ok {
		return p
	}
	b := alignedBuf(int(t.cfg.SlotBytes))
	return &b
}

func (t *Tablespace) putBuf(p *[]byte) { t.bufs.Put(p) }
