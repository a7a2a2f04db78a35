"""One ``APIRouter`` per entity."""
