// Command hello is a tiny main package for testbin's own test.
package main

import "fmt"

func main() { fmt.Println("hello from testbin") }
