package config

import (
	"fmt"
	"io"

	"github.com/BurntSushi/toml"
)

// Encode writes c as a TOML document that Parse reads back to the same
// configuration. Fields left at their zero value are written with the
// defaults Parse would give them, so the file shows what the daemons use.
// c itself is not modified.
func (c *Config) Encode(w io.Writer) error {
	d := *c
	d.setDefaults()
	if err := toml.NewEncoder(w).Encode(&d); err != nil {
		return fmt.Errorf("encode config of host %q: %w", c.Host, err)
	}
	return nil
}
