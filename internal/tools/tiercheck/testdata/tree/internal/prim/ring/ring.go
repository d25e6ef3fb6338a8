// Package ring is a bottom-tier leaf.
package ring

// Size is what the upper tiers import.
const Size = 64
