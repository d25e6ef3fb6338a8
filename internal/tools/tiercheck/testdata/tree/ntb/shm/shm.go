// Package shm is the deliberately wrong import: the link tier importing
// the api tier. tiercheck must reject it.
package shm

import "example.com/tree/socklike"

// Size reaches up.
const Size = socklike.Buffer
