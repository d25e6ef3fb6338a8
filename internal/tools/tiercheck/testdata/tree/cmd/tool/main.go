// Command tool imports the api tier from the top tier: accepted.
package main

import (
	"fmt"

	"example.com/tree/socklike"
)

func main() { fmt.Println(socklike.Buffer) }
