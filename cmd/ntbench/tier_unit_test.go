//go:build !integration

package main

// integrationTier: without -tags integration, go test ./... is the unit
// tier and the multi-process tests skip (see multiProcess).
const integrationTier = false
