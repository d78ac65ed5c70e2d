package composite
