module github.com/ntstack/ntstack

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.49.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
