// Command hello is what buildtest's tests build.
package main

import "fmt"

func main() { fmt.Println("hello from buildtest") }
