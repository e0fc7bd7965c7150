//go:build !amd64 || purego

package tablespace

// haveFold false: crcUpdate never calls fold here and uses hash/crc32.
const haveFold = false

// fold exists so that crcUpdate compiles on every platform; reaching it
// is a broken invariant (haveFold is a constant false), not a missing
// feature.
func fold(init uint32, p *byte, n int, k *foldKeys, out *[2]uint64) {
	panic("tablespace: fold called without haveFold (broken invariant)")
}
