package router

// withConfig returns DefaultConfig changed by set.
func withConfig(set func(*Config)) Config {
	c := DefaultConfig()
	set(&c)
	return c
}

// kvConfig returns DefaultKVAwareConfig changed by set.
func kvConfig(set func(*KVAwareConfig)) KVAwareConfig {
	c := DefaultKVAwareConfig()
	set(&c)
	return c
}
