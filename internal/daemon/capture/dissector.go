package capture

import (
	_ "embed"
	"fmt"
	"os"
)

// Dissector is the Wireshark Lua dissector of ntstack captures
// (ntstack.lua): it registers for the wtap_encap table's USER0 entry and
// names the fields ntstack.dir, ntstack.kind, ntstack.conn, ntstack.local,
// ntstack.ring, ntstack.len, the kinds' fields (ntstack.open.port,
// ntstack.window, ntstack.gen, ntstack.credit.consumed, ...), the leg
// header (ntstack.leg.type, .seq, .len) and the payload (ntstack.payload,
// and ntstack.text with non-printable bytes as dots).
//
//go:embed ntstack.lua
var Dissector []byte

// WriteDissector writes Dissector to the file path.
func WriteDissector(path string) error {
	if err := os.WriteFile(path, Dissector, 0o644); err != nil {
		return fmt.Errorf("write dissector: %w", err)
	}
	return nil
}
