//go:build !amd64 || purego

package continuation

const haveIDScan = false

func scanIDBlocks(p *byte, n int) int { panic("unreachable") }
