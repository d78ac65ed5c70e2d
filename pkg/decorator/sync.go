package decorator
