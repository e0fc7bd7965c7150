//go:build !amd64 || purego

package tablespace

const haveFold = false

func fold(init uint32, p *byte, n int, k *foldKeys, out *[2]uint64) {
	panic("tablespace: no folding CRC on this platform")
}
