// Package ntb imports the tier below it: accepted.
package ntb

import "example.com/tree/internal/prim/ring"

// Window is a link-tier value built on the prim tier.
const Window = 2 * ring.Size
