//go:build integration

package main

// integrationTier: built with -tags integration, the multi-process tests
// run (see multiProcess).
const integrationTier = true
