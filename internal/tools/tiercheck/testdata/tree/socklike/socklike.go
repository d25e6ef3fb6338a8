// Package socklike imports the link tier below it: accepted.
package socklike

import "example.com/tree/ntb"

// Buffer is an api-tier value built on the link tier.
const Buffer = ntb.Window
