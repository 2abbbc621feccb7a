"""placeholder"""
def configure(builder, **kw):
    return builder
